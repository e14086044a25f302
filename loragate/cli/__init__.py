"""The ``loragate`` command line."""
