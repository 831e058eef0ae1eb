"""A suite measures torch as ``pip install`` leaves it: byte-compiled.

An install without bytecode (``uv pip install`` without ``--compile-bytecode``, or a read-only
site-packages) makes every process that imports torch compile its modules from source again,
unless Python writes the bytecode on first use, which ``PYTHONDONTWRITEBYTECODE`` forbids. On
an H200 16-core host that added about 6 s to each run's trainer start (docs/BENCHMARKS.md,
"Where a run's start-up goes"). Before a suite's first step, ``ensure_bytecode`` compiles the
site-packages that hold torch (``python -m compileall``, as pip does at install): beside the
sources where Python may write there, else into the tool's cache folder, which the suite's
processes then read (``PYTHONPYCACHEPREFIX``, ``runtime.cache_dirs``). What it found and did is
the ``bytecode`` entry of the suite's machine description (``bench.report.machine_doc``).
``--as-installed`` measures the install as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from runtime import cache_dirs

STATE: dict[str, str] = {}
"""What ``ensure_bytecode`` found and did in this process (``{"torch": ...}``), for the machine
description; empty before it ran."""


def ensure_bytecode(compile_missing: bool = True, module: str = "torch") -> str:
    """Byte-compiles the site-packages holding ``module`` where ``module`` has no bytecode
    (see the module docstring) unless ``compile_missing`` is off; returns what was found and
    done, as the machine description says it."""
    cached = cache_dirs._missing_bytecode(module)
    if cached is None:
        said = "installed with its bytecode" if _installed(module) else "not installed"
    elif not compile_missing:
        said = "installed without bytecode; measured as installed (--as-installed)"
    else:
        site = cache_dirs.site_of(module) or cached.parent.parent
        where = "beside the sources"
        if not cache_dirs._writable(cached.parent) and sys.pycache_prefix is None:
            folder = cache_dirs.bytecode_folder()
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[cache_dirs.BYTECODE_ENV] = str(folder)  # the suite's processes read it,
            sys.pycache_prefix = str(folder)  # and so does this one
        if sys.pycache_prefix is not None:
            where = f"into {sys.pycache_prefix}"
        env = dict(os.environ)
        if sys.pycache_prefix is not None:
            env[cache_dirs.BYTECODE_ENV] = sys.pycache_prefix
        start = time.monotonic()
        ran = subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "-j", "0", str(site)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        took = time.monotonic() - start
        done = cache_dirs._missing_bytecode(module) is None
        said = (
            f"installed without bytecode; {site} compiled {where} before the first step "
            f"({took:.1f} s{'' if done else f', compileall exit {ran.returncode}: incomplete'})"
        )
        print(f"[bench] {module} {said}", file=sys.stderr, flush=True)
    STATE[module] = said
    return said


def _installed(module: str) -> bool:
    return cache_dirs._spec(module) is not None
