"""A learning curve as JSON lines: wall time, trained steps and mean return, about once a second.

``autotune train --progress FILE`` writes one, and so do the benchmark peers in ``bench/peers``,
so every run can be put on one time axis and one step axis. Each line is an object:

    {"t": 1763769600.12, "steps": 81920, "return": 512.3, "episodes": 140, "joules": 5210.4}

``t`` is Unix time, ``steps`` the trained env steps so far (steps the learner has consumed),
``return`` the mean undiscounted return of the last 100 finished episodes (``null`` before the
first) and ``episodes`` the episodes finished so far (``null`` where a peer does not count them).
``autotune train`` adds ``joules``, the run's energy so far (of the runs before it too, where it
went on from a checkpoint that saved theirs), and, where known, the learner's last update:
``noise_scale`` (its gradient noise scale), ``lr`` (its learning rate) and ``kl`` (the KL
divergence it moved the policy by).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


class ProgressLog:
    """Appends progress lines to ``path``, at most one per ``every_s``.

    Args:
        path: The JSON-lines file.
        every_s: Minimum seconds between lines; ``write(force=True)`` ignores it.
        append: Go on with an existing file (a resumed run) instead of truncating it; a cut-off
            last line left by a killed run is dropped first.
    """

    def __init__(self, path: str | Path, every_s: float = 1.0, append: bool = False) -> None:
        if every_s < 0:
            raise ValueError(f"every_s={every_s!r}: must be >= 0")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.every_s = every_s
        if append and self.path.exists():
            kept = "".join(json.dumps(r) + "\n" for r in read_progress(self.path))
            self.path.write_text(kept)
        self._f = self.path.open("a" if append else "w", buffering=1)
        self._last_t = -math.inf
        self._last_steps = -1

    def due(self, steps: int) -> bool:
        """Whether ``write`` would add a line now (so figures costly to read are read only
        then)."""
        return time.time() - self._last_t >= self.every_s and steps != self._last_steps

    def write(
        self,
        steps: int,
        episode_return: float | None = None,
        episodes: int | None = None,
        force: bool = False,
        noise_scale: float | None = None,
        joules: float | None = None,
        lr: float | None = None,
        kl: float | None = None,
    ) -> bool:
        """Adds a line unless one was written less than ``every_s`` ago (or nothing changed
        since the last line); returns whether it did. ``noise_scale`` (the learner's gradient
        noise scale, in samples), ``lr`` and ``kl`` are written where given."""
        now = time.time()
        if not force and not self.due(steps):
            return False
        ret = (
            None
            if episode_return is None or not math.isfinite(episode_return)
            else float(episode_return)
        )
        line = {"t": now, "steps": int(steps), "return": ret, "episodes": episodes}
        for name, value in (("noise_scale", noise_scale), ("lr", lr), ("kl", kl)):
            if value is not None and math.isfinite(value):
                line[name] = float(value)
        if joules is not None and math.isfinite(joules):
            line["joules"] = round(float(joules), 1)
        self._f.write(json.dumps(line) + "\n")
        self._last_t, self._last_steps = now, int(steps)
        return True

    def write_result(
        self,
        result: dict[str, Any],
        steps_before: int = 0,
        episodes_before: int = 0,
        joules_before: float = 0.0,
    ) -> None:
        """The last line, from a finished run's result (its counts after the drain), on top of
        what the runs before it did (a run that went on from a checkpoint)."""
        energy, lr = result["energy"], result.get("learning_rate") or {}
        self.write(
            steps_before + result["env_steps"],
            result["return_mean"],
            episodes_before + result["episodes"],
            force=True,
            noise_scale=(result.get("noise_scale") or {}).get("samples"),
            joules=joules_before + energy["gpu_j"] + energy["cpu_j"],
            lr=lr.get("last"),
            kl=lr.get("last_kl"),
        )

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_progress(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a progress file in order. A cut-off last line (a run killed mid-write) is
    left out; any other malformed line raises ``ValueError`` naming the file and line."""
    lines = Path(path).read_text().splitlines()
    out = []
    for i, text in enumerate(lines, 1):
        try:
            row = json.loads(text)
            if not isinstance(row, dict) or not {"t", "steps"} <= row.keys():
                raise ValueError("not an object with 't' and 'steps'")
        except ValueError as exc:
            if i == len(lines):
                break
            raise ValueError(
                f"{path}:{i}: malformed progress line ({exc}): {text[:80]!r}"
            ) from None
        out.append(row)
    return out


def value_at_steps(rows: list[dict[str, Any]], steps: int, key: str = "return") -> float | None:
    """``key`` of the first line with at least ``steps`` trained steps that has one (None if
    no line reached ``steps`` with a value: a resumed run's first lines may have no return
    yet)."""
    for row in rows:
        if row["steps"] >= steps and row.get(key) is not None:
            return row[key]
    return None


def latest_steps(path: str | Path) -> int:
    """The newest trained-step count in a progress file: 0 before its first line, or while it
    cannot be read yet (a run that is starting). Callers poll this to wait on a run's
    progress."""
    try:
        rows = read_progress(path)
    except (OSError, ValueError):
        return 0
    return int(rows[-1]["steps"]) if rows else 0
