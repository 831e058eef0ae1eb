"""The training runtime: actor processes, the four experience stages, and the trainer GMIs.

It imports ``policies`` (the layer below) and nothing of ``autotune`` (the layer above).
Package imports stay light (no torch) so the compressor and migrator processes start fast;
numpy is imported first, with SIGINT blocked, so that its BLAS threads never take a run's
Ctrl-C (``runtime.child_start``).
"""

from runtime.child_start import ctrl_c_for_main_only

with ctrl_c_for_main_only():  # numpy's BLAS threads start as it loads: none takes a Ctrl-C
    import numpy  # noqa: F401  (runtime.child_start says why)
