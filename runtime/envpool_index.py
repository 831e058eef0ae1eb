"""What the installed EnvPool has, and EnvPool imported with only the family a process makes.

``import envpool`` registers every family of envs EnvPool ships (``envpool.entry``), importing
each family's Python side (jumanji's renderer imports matplotlib.pyplot): about a second of CPU
in every process that makes EnvPool envs, every actor among them. So the ids EnvPool has, and
the family each belongs to (its import path, ``envpool.classic_control`` for CartPole-v1), are
read from EnvPool once and kept in the tool's cache folder (``runtime.cache_dirs``) for that
EnvPool (its version and where it is installed; ``IDS_FILE``). A process that only asks which
ids there are (a tuner's knob space, ``auto`` for an id EnvPool lacks) does not import it, and
one that makes envs (``registration``) imports the package without its ``__init__`` and then
only that family's registration: about a fifth of the CPU. The package module is whole again
(its ``__init__`` run) the first time anything asks it for a name it lacks, so code that imports
``envpool`` itself still finds all of it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
from types import ModuleType

logger = logging.getLogger(__name__)

IDS_FILE = "envpool-ids.json"
"""The installed EnvPool's ids by family, in the tool's cache folder (see the module docstring)."""

PARTIAL = "_autotune_partial"
"""Set on EnvPool's package module while only some families are imported (``registration``)."""


@functools.cache
def index() -> tuple[dict[str, str], str | None]:
    """The installed EnvPool's ids, each with its family, and why it cannot be used here (None
    where it can): ``not installed``, or the error of an installed EnvPool that does not load
    (a library of its own missing on this host, such as MuJoCo's ``libEGL.so.1``), logged once
    as a warning."""
    spec = importlib.util.find_spec("envpool")
    if spec is None:
        return {}, "not installed"
    key = _key(spec.origin)
    known = _read(key)
    if known is not None:
        return known, None
    try:
        import envpool
        from envpool.registration import registry
    except ImportError as exc:
        logger.warning("EnvPool is installed but does not load (%s): actors use gymnasium", exc)
        return {}, f"installed but does not load: {exc}"
    families = {str(i): str(registry.specs[i][0]) for i in envpool.list_all_envs()}
    _write(key, families)
    return families, None


def registration(env_id: str) -> ModuleType:
    """``envpool.registration`` with ``env_id``'s family registered (with every family where
    the kept ids do not name its family, or EnvPool is imported whole already).

    Raises:
        ImportError: EnvPool does not load here.
    """
    family = index()[0].get(env_id)
    pkg = sys.modules.get("envpool")
    if family is None or (pkg is not None and not getattr(pkg, PARTIAL, False)):
        import envpool

        _ = envpool.make  # a partly imported package is made whole by being asked
        return sys.modules["envpool.registration"]
    if pkg is None:
        spec = importlib.util.find_spec("envpool")
        pkg = importlib.util.module_from_spec(spec)
        setattr(pkg, PARTIAL, True)
        pkg.__getattr__ = functools.partial(_made_whole, pkg, spec)
        sys.modules["envpool"] = pkg
    importlib.import_module(f"{family}.registration")
    return sys.modules["envpool.registration"]


def _made_whole(pkg: ModuleType, spec, name: str):
    """Runs EnvPool's ``__init__`` in its partly imported package (the families imported
    already stay as they are) and returns ``name`` from it: the package's ``__getattr__``."""
    if getattr(pkg, PARTIAL, False):
        setattr(pkg, PARTIAL, False)
        del pkg.__getattr__
        spec.loader.exec_module(pkg)
    return pkg.__dict__[name] if name in pkg.__dict__ else _missing(name)


def _missing(name: str):
    raise AttributeError(f"module 'envpool' has no attribute {name!r}")


def _key(origin: str | None) -> str:
    from importlib import metadata

    try:
        version = metadata.version("envpool")
    except metadata.PackageNotFoundError:
        version = None
    try:
        stamp = os.stat(origin).st_mtime_ns if origin else None
    except OSError:
        stamp = None
    return f"{version}|{origin}|{stamp}"


def _read(key: str) -> dict[str, str] | None:
    from runtime.cache_dirs import cache_root

    try:
        doc = json.loads((cache_root() / IDS_FILE).read_text())
        if doc.get("key") != key:
            return None  # another EnvPool's
        ids = {str(i): str(f) for f, members in doc["families"].items() for i in members}
        return ids or None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RuntimeError):
        return None  # none kept, of an older form, or unreadable: EnvPool is asked


def _write(key: str, families: dict[str, str]) -> None:
    from runtime.atomic_file import replaced
    from runtime.cache_dirs import cache_root

    by_family: dict[str, list[str]] = {}
    for env_id, family in families.items():
        by_family.setdefault(family, []).append(env_id)
    try:
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        with replaced(root / IDS_FILE, plain_mode=True) as f:
            json.dump({"key": key, "families": by_family}, f)
    except (OSError, RuntimeError):  # no cache folder to keep it in: asked again next time
        return
