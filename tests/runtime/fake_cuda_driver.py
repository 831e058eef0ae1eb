"""Imported by a spare GMI in a test: maps a file named ``libcuda.so.1`` into the process, as
an import that starts the CUDA driver would (``runtime.gmi.process.cuda_driver_loaded`` reads
``/proc/self/maps``). Not a test module: pytest collects ``test_*`` files only."""

import mmap
import os
import tempfile

_dir = tempfile.mkdtemp(prefix="fake-driver-")
_path = os.path.join(_dir, "libcuda.so.1")
with open(_path, "wb") as f:
    f.write(b"\0" * mmap.PAGESIZE)
_file = open(_path, "rb")  # noqa: SIM115 - held open with its mapping for the process's life
MAPPED = mmap.mmap(_file.fileno(), 0, access=mmap.ACCESS_READ)
