"""Who may ask what: the bearer tokens and their scopes, the brake on guessing, the
audit trail of who asked."""
