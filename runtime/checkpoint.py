"""The learner's state kept across runs: ``autotune train --checkpoint DIR``.

A run given ``DIR`` writes two files there when it ends (its steps or its wall-clock limit
reached, or a Ctrl-C drain), from rank 0 of its trainer GMIs:

* ``learner.pt``: the learner's ``state()`` (the model with its observation statistics, the
  optimiser, the version and the trained steps), as a GMI hand-over passes it on;
* ``learner.json``: what a later run checks before loading it (the environment, the policy and
  the layer sizes it resolves to, the observation and action sizes, the observation
  normalisation, the trained steps, the version, when it was saved, and the SHA-256 of the
  ``learner.pt`` it describes; what must match: ``runtime.checkpoint_fit``).

Both are written whole beside their names, synced, then renamed, ``learner.pt`` first, so a
reader never sees half a file. A crash between the two renames leaves the new ``learner.pt``
with the previous save's ``learner.json``; the digest shows it, and the trained steps and
version are then read from ``learner.pt`` itself (the env, policy and sizes cannot differ
between two saves of one directory: a run of another kind is refused before it starts). A
save never takes the directory back to a learner that has come less far than the one it holds
(``state_key``; a trainer generation restarted from an older state would otherwise).

The runner adds ``returns.json`` when the run has ended: the last 100 episode returns and the
episodes of every run so far, tagged with the trained steps of the ``learner.pt`` beside it. A
resumed run starts its return window from them (as SB3 keeps its episode buffer), so its
"mean return of the last 100 episodes" does not restart from the first, shortest episodes of
freshly reset environments. A ``returns.json`` of another save is ignored.

A run whose ``DIR`` holds them starts its trainers from that state. ``steps`` then counts the
trained steps of every run together (the learning-rate schedule goes on where it stopped), and
experience the actors sampled before they had the loaded weights is discarded and counted
(``discarded_steps``), never trained on. A ``DIR`` that does not exist yet is created at the end.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from runtime import checkpoint_fit
from runtime.atomic_file import replaced
from runtime.config import ConfigError, TrainConfig
from runtime.envs import EnvInfo
from runtime.learner_state import Saved, StateError, load_state, state_key

# torch is imported only where ``learner.pt`` is read or written: the runner imports this
# module without loading torch, and loads it only to check a checkpoint it resumes from.
# ``learner.pt`` is only ever read with ``torch.load(weights_only=True)`` (``load_state``).

STATE_NAME = "learner.pt"
INFO_NAME = "learner.json"
RETURNS_NAME = "returns.json"
LOCK_NAME = ".lock"

FORMAT = 3
"""2: learner.json has state_sha256; 3: layers and normalize_obs too (older files are read)."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """A checkpoint a run starts from."""

    state_file: str
    """The ``learner.pt`` to load."""
    trained_steps: int
    """Trained env steps of the runs before (counted toward ``steps``)."""
    version: int
    """The learner version saved; experience of an older version is not trained on."""


def read_info(directory: str) -> dict[str, Any] | None:
    """``learner.json`` of ``directory``, or None where there is none.

    Raises:
        ConfigError: ``directory`` is a file, or its checkpoint is incomplete or unreadable.
    """
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError([f"checkpoint={directory!r}: is a file; give a directory"])
    info_path = os.path.join(directory, INFO_NAME)
    state_path = os.path.join(directory, STATE_NAME)
    if not os.path.exists(info_path) and not os.path.exists(state_path):
        return None
    if not (os.path.exists(info_path) and os.path.exists(state_path)):
        raise ConfigError(
            [
                f"checkpoint={directory!r}: holds only one of {STATE_NAME} and "
                f"{INFO_NAME}; a checkpoint needs both (move the directory aside "
                "to start from scratch)"
            ]
        )
    try:
        with open(info_path) as f:
            doc = json.load(f)
        int(doc["trained_steps"]), int(doc["version"])  # checked, not used
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError([f"checkpoint={directory!r}: unreadable {INFO_NAME} ({exc})"]) from None
    return doc


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _counts_from_state(directory: str, state: dict[str, Any]) -> dict[str, int]:
    """The trained steps and version of ``learner.pt`` itself (``state``), for a
    ``learner.json`` that is one save behind it."""
    counts = {"trained_steps": state["trained_steps"], "version": state["version"]}
    logger.warning(
        "checkpoint %s: %s is one save behind %s (a stop between the two renames); "
        "resuming from %s's %d trained steps, version %d",
        directory,
        INFO_NAME,
        STATE_NAME,
        STATE_NAME,
        counts["trained_steps"],
        counts["version"],
    )
    return counts


def check(cfg: TrainConfig, info: EnvInfo) -> Resume | None:
    """What the run ``cfg`` resumes from: None without ``cfg.checkpoint`` or with an empty one.

    Raises:
        ConfigError: the checkpoint belongs to another environment, network (layer sizes) or
            observation normalisation (``runtime.checkpoint_fit``), or already holds
            ``cfg.steps`` trained steps (each said with what would be allowed).
    """
    if cfg.checkpoint is None:
        return None
    _check_writable(cfg.checkpoint)
    _hold(cfg.checkpoint)
    doc = read_info(cfg.checkpoint)
    if doc is None:
        return None
    state_path = os.path.join(cfg.checkpoint, STATE_NAME)
    behind = "state_sha256" in doc and doc["state_sha256"] != _sha256(state_path)
    try:  # the trainers load it: refuse a file that is not a learner state now, unrun
        state = load_state(state_path)
    except StateError as exc:
        why = f"{INFO_NAME} does not describe {STATE_NAME}, and {STATE_NAME} is unreadable ("
        why = f"{why}{exc})" if behind else str(exc)
        raise ConfigError([f"checkpoint={cfg.checkpoint!r}: {why}"]) from None
    if behind and state_key(state) <= state_key(doc):
        raise ConfigError(
            [
                f"checkpoint={cfg.checkpoint!r}: {STATE_NAME} does not match the digest in "
                f"{INFO_NAME}, and it is not a later save (version {state['version']} against "
                f"{doc['version']}): it changed after it was saved; it was not loaded (remove "
                "the checkpoint directory, or give another, to train afresh)"
            ]
        )
    if behind:
        doc.update(_counts_from_state(cfg.checkpoint, state))
    problems = checkpoint_fit.problems(cfg.checkpoint, doc, state, cfg, info)
    steps = int(doc["trained_steps"])
    if steps >= cfg.steps:
        problems.append(
            f"checkpoint={cfg.checkpoint!r}: already holds {steps} trained steps, "
            f"steps={cfg.steps} counts every run together; give steps > {steps} "
            "to train on"
        )
    recent = load_returns(cfg.checkpoint, steps)[0]  # a malformed window: none
    if cfg.target_return is not None and len(recent) >= 100:
        mean = sum(recent[-100:]) / 100
        if mean >= cfg.target_return:
            problems.append(
                f"checkpoint={cfg.checkpoint!r}: its last 100 episodes already average "
                f"{mean:.4g} >= target_return={cfg.target_return:g}; give a higher target"
            )
    if problems:
        raise ConfigError(problems)
    return Resume(state_path, steps, int(doc["version"]))


def _check_writable(directory: str) -> None:
    """Refuses a checkpoint directory this run could not save into, before it trains."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        what = "is a file" if not os.path.isdir(path) else "is not writable"
        raise ConfigError([f"checkpoint={directory!r}: {path} {what}; give a directory to save in"])


_HELD: dict[str, int] = {}
"""Checkpoint directories this process holds (their lock's file descriptor), for its life."""


def _hold(directory: str) -> None:
    """Takes ``directory``'s lock for this process: two runs saving into one directory would
    overwrite each other's saves. Refuses it while another process holds it."""
    import fcntl

    key = os.path.realpath(directory)
    if key in _HELD:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # a path the checks above let by (root on /proc, a full disk)
        raise ConfigError(
            [
                f"checkpoint={directory!r}: cannot save in it ({exc.strerror}); give a directory "
                "this user can create and write"
            ]
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            [f"checkpoint={directory!r}: another run is saving into it; give another directory"]
        ) from None
    _HELD[key] = fd


def saved_key(directory: str) -> tuple[int, int] | None:
    """``state_key`` of the learner saved in ``directory``: from ``learner.json`` where it
    describes ``learner.pt`` (its digest matches), else from ``learner.pt`` itself; None where
    there is none, or none that loads."""
    state_path = os.path.join(directory, STATE_NAME)
    if not os.path.exists(state_path):
        return None
    try:
        doc = read_info(directory)
    except ConfigError:
        doc = None
    if doc is not None and doc.get("state_sha256") == _sha256(state_path):
        return state_key(doc)
    try:
        return state_key(load_state(state_path))
    except StateError:
        return None  # a save replaces a file that is not a learner state


def save(directory: str, state: dict[str, Any], cfg: TrainConfig, info: EnvInfo) -> bool:
    """Writes ``state`` (a learner's ``state()``) and its ``learner.json`` into ``directory``,
    unless the learner saved there has come further (``state_key``): a save never takes a
    checkpoint back to an older state. False where it was not written (a warning says why)."""
    import torch

    os.makedirs(directory, exist_ok=True)
    held = saved_key(directory)
    if held is not None and held > state_key(state):
        logger.warning(
            "checkpoint %s holds the learner at version %d (%d trained steps), further than "
            "this one at version %d (%d trained steps): not overwritten with the older state",
            directory,
            *held,
            *state_key(state),
        )
        return False
    state_path = os.path.join(directory, STATE_NAME)
    info_path = os.path.join(directory, INFO_NAME)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    doc = {
        "format": FORMAT,
        **checkpoint_fit.describe(cfg, info),
        "trained_steps": int(state["trained_steps"]),
        "version": int(state["version"]),
        "saved_unix": time.time(),
        "state_sha256": hashlib.sha256(data).hexdigest(),
    }
    with (
        replaced(info_path, sync=True) as info_file,  # renamed second, as it leaves last
        replaced(state_path, "wb", sync=True) as state_file,
    ):
        state_file.write(data)
        json.dump(doc, info_file, indent=2)
    return True


def keep_furthest(cfg: TrainConfig, info: EnvInfo, saved: Saved | None) -> bool:
    """A run that fails (its pipeline given up, a second Ctrl-C) keeps in its checkpoint the
    furthest learner state its GMIs left (``GMIFleet.kept``), unless the checkpoint holds one
    further already (``save``); False where nothing was kept or it could not be."""
    if cfg.checkpoint is None or saved is None:
        return False
    own = os.path.join(cfg.checkpoint, STATE_NAME)
    if os.path.exists(own) and os.path.samefile(saved.path, own):
        return False  # the furthest is the checkpoint's own: nothing to write again
    try:
        return save(cfg.checkpoint, load_state(saved.path), cfg, info)
    except (StateError, OSError) as exc:
        logger.error("the learner state could not be kept in %s: %s", cfg.checkpoint, exc)
        return False


def save_returns(
    directory: str, returns: list[float], episodes: int, totals: dict[str, float] | None = None
) -> None:
    """Writes the return window and the episode count of all runs beside the saved learner
    (nothing where no learner was saved), and ``totals``, the seconds and joules of all runs
    (``runtime.target.RunTotals``), where known."""
    try:
        doc = read_info(directory)
    except ConfigError:
        doc = None
    if doc is None:
        return
    with replaced(os.path.join(directory, RETURNS_NAME)) as f:
        json.dump(
            {
                "trained_steps": int(doc["trained_steps"]),
                "episodes": episodes,
                "returns": [float(r) for r in returns],
                "totals": totals,
            },
            f,
        )


def _saved_returns(directory: str, trained_steps: int) -> dict[str, Any] | None:
    """``returns.json`` of ``directory`` where it belongs to the save of ``trained_steps``."""
    try:
        with open(os.path.join(directory, RETURNS_NAME)) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) and int(doc["trained_steps"]) == trained_steps else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_totals(directory: str, trained_steps: int) -> dict[str, float] | None:
    """The seconds and joules of all runs up to the save of ``trained_steps`` steps (as
    ``save_returns`` wrote them); None where they are not known (a run that was killed, or a
    save from before they were kept)."""
    totals = (_saved_returns(directory, trained_steps) or {}).get("totals")
    try:
        return {k: float(totals[k]) for k in ("seconds", "joules")}
    except (KeyError, TypeError, ValueError):
        return None


def load_returns(directory: str, trained_steps: int) -> tuple[list[float], int]:
    """The return window and episode count saved with the learner of ``trained_steps`` steps;
    ``([], 0)`` where there are none or they belong to another save."""
    doc = _saved_returns(directory, trained_steps)
    try:
        if doc is not None:
            return [float(r) for r in doc["returns"]], int(doc["episodes"])
    except (KeyError, TypeError, ValueError):
        pass
    logger.info(
        "checkpoint %s: no episode returns of this save; the return window starts empty", directory
    )
    return [], 0


def result_doc(cfg: TrainConfig, resume: Resume | None) -> dict[str, Any] | None:
    """The ``checkpoint`` entry of a run's result: where, what it resumed from, what is saved."""
    if cfg.checkpoint is None:
        return None
    try:
        doc = read_info(cfg.checkpoint)
    except ConfigError:
        doc = None
    return {
        "dir": os.path.abspath(cfg.checkpoint),
        "resumed_from_steps": resume.trained_steps if resume is not None else 0,
        "resumed_from_version": resume.version if resume is not None else None,
        "saved_steps": int(doc["trained_steps"]) if doc else None,
        "saved_version": int(doc["version"]) if doc else None,
    }
