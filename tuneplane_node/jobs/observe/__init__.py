"""What a console reads of its jobs: views, the watch, logs (followed),
stats; the results they read are the floor's words (`jobs.words`)."""
