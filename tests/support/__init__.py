"""What the tests share, one module per concern; test modules import from these (and
`tests.fakes`), never from each other."""
