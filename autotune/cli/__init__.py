"""The ``autotune`` command line: one module per command, plus display and output; the only layer that owns the terminal."""
