"""The ``autotune`` command line: one module per command, plus display and output; the only
layer that owns the terminal. A command imports optuna, torch or matplotlib (through its
workflow) inside its function, so that no other command pays for them."""

from runtime.child_start import ctrl_c_for_main_only

with ctrl_c_for_main_only():  # numpy's BLAS threads start as it loads: none takes a Ctrl-C
    import numpy  # noqa: F401  (runtime.child_start says why)
