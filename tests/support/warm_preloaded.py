"""A module a test's warm worker imports at its start (``--preload``): a run that finds it
already in ``sys.modules`` ran where that import was paid."""
