"""The suites of ``python -m bench``, one module each: ``NAME``, ``HELP``, ``add_args`` and
``plan`` (the steps, and what to do once all are done)."""
