"""The ``autotune`` command line: one module per command, plus display and output; the only
layer that owns the terminal. A command imports optuna, torch or matplotlib (through its
workflow) inside its function, so that no other command pays for them."""
