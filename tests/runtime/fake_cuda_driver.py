"""Imported by a spare GMI in a test: opens a file named ``nvidiactl`` and keeps it open, as an
import that starts the CUDA driver (``cuInit`` opens ``/dev/nvidiactl``) would;
``runtime.gmi.process.cuda_driver_started`` reads the process's open files. Not a test module:
pytest collects ``test_*`` files only."""

import os
import tempfile

_dir = tempfile.mkdtemp(prefix="fake-driver-")
NODE = open(os.path.join(_dir, "nvidiactl"), "wb")  # noqa: SIM115 - held open for the process's life
