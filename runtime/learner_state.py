"""A learner state file (a checkpoint's ``learner.pt``, a GMI hand-over or recovery file):
read as tensors and plain data only (``load_state``), and how far the learner in it has come
(``state_key``), and which of several files holds the learner furthest on (``furthest``)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class StateError(ValueError):
    """A learner state file that is not one: refused unread (nothing in it runs)."""


STATE_KEYS = {"model": dict, "optimizer": dict, "version": int, "trained_steps": int}


def _why(exc: BaseException) -> str:
    """The line of a load error that says what was refused (torch's message is long)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(exc).splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in lines:
        found = re.search(r"Unsupported (global|operand).*?(?= was not|$)", ln)
        if found:
            return f"it names code to run: {found.group(0)}"
    return lines[0] if lines else type(exc).__name__


def load_state(path: str, device: Any = "cpu") -> dict[str, Any]:
    """A learner ``state()`` from ``path`` (a checkpoint's ``learner.pt`` or a hand-over file),
    read with ``torch.load(weights_only=True)``: tensors and plain containers only, so a file
    crafted to run code on load is refused, not run.

    Raises:
        StateError: the file cannot be read that way, or is not a learner state (what it
            lacks is named).
    """
    import torch

    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # UnpicklingError, OSError, EOFError; a damaged file's KeyError...
        raise StateError(
            f"{path}: not a learner state that loads as tensors and plain data "
            f"({_why(exc)}); it was not loaded"
        ) from None
    if not isinstance(state, dict):
        raise StateError(f"{path}: holds a {type(state).__name__}, not a learner state")
    wrong = [k for k, kind in STATE_KEYS.items() if not isinstance(state.get(k), kind)]
    if wrong:
        raise StateError(
            f"{path}: not a learner state: {', '.join(wrong)} missing or of the wrong type "
            f"(a learner state holds {', '.join(STATE_KEYS)})"
        )
    return state


def state_key(counts: dict[str, Any]) -> tuple[int, int]:
    """How far a learner state has come: ``(version, trained_steps)``. Both only grow, the
    version by one at every update, in whichever process holds the learner, so of two states
    of one run (one line of descent: a restart goes on from the furthest state kept) the
    greater key is the later one. A file's time says less: it is when the file was written,
    not how far the learner in it had come."""
    return int(counts["version"]), int(counts["trained_steps"])


@dataclass(frozen=True)
class Saved:
    """A learner state file and how far the learner in it had come."""

    path: str
    version: int
    trained_steps: int


def furthest(paths: Iterable[str | None]) -> Saved | None:
    """Of the learner state files ``paths`` (None and missing ones skipped), the one furthest
    on by ``state_key``, the one written last where two are as far (then they hold one
    state); None where none exists. A file that does not load as a learner state is skipped,
    with a warning."""
    found: list[tuple[tuple[int, int, float], Saved]] = []
    for path in dict.fromkeys(p for p in paths if p is not None and os.path.exists(p)):
        try:
            state = load_state(path)
            mtime = os.path.getmtime(path)
        except (StateError, OSError) as exc:
            logger.warning("learner state %s skipped: %s", path, exc)
            continue
        version, steps = state_key(state)
        found.append(((version, steps, mtime), Saved(path, version, steps)))
    return max(found, key=lambda item: item[0])[1] if found else None
