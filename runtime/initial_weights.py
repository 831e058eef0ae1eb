"""The version-0 weights actors with ``inference='actor'`` act with until the trainer's arrive:
built once per policy and seed in the runner (torch is imported there only for this), and
handed to local actors as a file in the run's directory, not in their start arguments.

A spawn start writes its arguments into a pipe that the child reads only once its
interpreter is up and has imported the actor's modules. Arguments over the pipe's 64 KiB (a
256:128:64 policy's weights are about 300 KB) made each ``Process.start`` wait for that: on an
H200 16-core host a respawn of 15 actors held the runner's loop for 21 s (no progress lines,
no target check, the tuner's counters stale). A path keeps the arguments small, so the
children start side by side while the runner goes on. The file is ``.npz``, read with
``allow_pickle=False``; remote actors (``runtime.cluster``) still get the arrays themselves.

Building them imports torch (about 1.5 s of CPU), so they are also kept in the tool's cache
folder (``runtime.cache_dirs``, ``initial-weights/``), by the workload's shapes, the policy,
the seed, the torch version, the bytes of ``policies``' code and the CPU: a later run of the same
policy and seed reads them there and its runner never imports torch.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from runtime.atomic_file import replaced

Weights = tuple[list[str], list[np.ndarray]]


class InitialWeights:
    """The version-0 weights of a run's actors, by policy, seed and observation normalisation;
    written under ``directory`` (set once the run has one) for local actors."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.directory: str | Path | None = None
        self._arrays: dict[tuple[Any, ...], Weights] = {}
        self._files: dict[tuple[Any, ...], str] = {}
        """Files written, by directory and weights' key."""

    @staticmethod
    def _key(cfg: Any) -> tuple[Any, ...]:
        return (cfg.policy, cfg.seed, cfg.learner.normalize_obs)

    def arrays(self, cfg: Any) -> Weights | None:
        """The weights for ``cfg``'s actors; None where an inference GMI acts for them."""
        if cfg.inference != "actor":
            return None
        key = self._key(cfg)
        if key not in self._arrays:
            info = self.info
            shape = (info.obs_dim, info.act_dim, info.discrete, *key)
            kept = _kept_path(shape)
            weights = _read_kept(kept)
            if weights is None:
                from policies.actor_critic import initial_state_arrays

                weights = initial_state_arrays(
                    info.obs_dim,
                    info.act_dim,
                    info.discrete,
                    cfg.policy,
                    cfg.learner.normalize_obs,
                    cfg.seed,
                )
                _keep(kept, weights)
            self._arrays[key] = weights
        return self._arrays[key]

    def for_local(self, cfg: Any) -> Weights | str | None:
        """What a local actor's start arguments carry: the file's path once the run has a
        directory, else the arrays; None where an inference GMI acts."""
        weights = self.arrays(cfg)
        if weights is None or self.directory is None:
            return weights
        key = (str(self.directory), *self._key(cfg))
        if key not in self._files:
            path = Path(self.directory, f"initial-weights-{len(self._files)}.npz")
            save(path, weights)
            self._files[key] = str(path)
        return self._files[key]


def save(path: Path, weights: Weights) -> None:
    """Writes ``weights`` to ``path`` whole (a temporary file, then a rename)."""
    names, arrays = weights
    parts = {f"a{i}": a for i, a in enumerate(arrays)}
    with replaced(path, "wb") as f:
        np.savez(f, names=np.array(names, dtype=str), **parts)


def load(initial: Weights | str) -> Weights:
    """The weights an actor was started with: ``initial`` itself, or read from its file.

    Raises:
        ValueError: the file is not weights as ``save`` writes them.
    """
    if not isinstance(initial, str):
        return initial
    try:
        with np.load(initial, allow_pickle=False) as doc:
            names = [str(n) for n in doc["names"]]
            arrays = [doc[f"a{i}"] for i in range(len(names))]
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"cannot read the initial weights {initial!r}: {exc}") from None
    return names, arrays


def _kept_path(shape: tuple[Any, ...]) -> Path | None:
    """Where the weights of ``shape`` (obs dim, act dim, discrete, policy, seed, normalisation)
    are kept in the cache folder; None where it cannot be named (no home folder)."""
    import hashlib
    from importlib import metadata

    from runtime.cache_dirs import cache_root, cpu_model

    try:
        torch_version = metadata.version("torch")
        policies = Path(__file__).parents[1] / "policies"  # whatever builds or seeds a layer
        code = b"".join(f.read_bytes() for f in sorted(policies.glob("*.py")))
        root = cache_root()
    except (metadata.PackageNotFoundError, OSError, RuntimeError):
        return None
    facts = repr((shape, torch_version, cpu_model())).encode()
    digest = hashlib.sha256(facts + code).hexdigest()[:32]
    return root / "initial-weights" / f"{digest}.npz"


def _read_kept(path: Path | None) -> Weights | None:
    if path is None or not path.is_file():
        return None
    try:
        return load(str(path))
    except ValueError:  # a torn or foreign file: built again, and kept anew
        return None


def _keep(path: Path | None, weights: Weights) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save(path, weights)
    except OSError:  # no room or no right to keep it: built again next time
        return
