"""What ``autotune wrap`` measures a run over: the script's output copied through as it comes
(``Tee``, noting its first line), and the marks its measured window runs between (``Marks``:
its first and latest report, or its first line of output and its end)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

JOIN_S = 10.0
"""Longest wait for the last of the script's output once it has exited."""


class Tee:
    """Copies the script's stdout through to ours, line by line, as it comes, noting when the
    first line came (what a script that never reports is timed from)."""

    def __init__(self, pipe: Any) -> None:
        self.first_line_at: float | None = None
        self._thread = threading.Thread(target=self._copy, args=(pipe,), daemon=True)
        self._thread.start()

    def _copy(self, pipe: Any) -> None:
        for line in iter(pipe.readline, b""):  # read to the end, whatever the writes do
            if self.first_line_at is None:
                self.first_line_at = time.monotonic()
            with contextlib.suppress(Exception):  # a closed or odd stdout: the pipe drains on
                _write(line)
        pipe.close()

    def join(self) -> None:
        self._thread.join(timeout=JOIN_S)


def _write(line: bytes) -> None:
    """``line`` to our stdout: as bytes where it has a buffer, else as text (a notebook's or
    ``contextlib.redirect_stdout``'s stream)."""
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        buffer.write(line)
        buffer.flush()
    elif out is not None:
        out.write(line.decode(errors="replace"))
        out.flush()


@dataclass
class Marks:
    """Where a trial's measured window starts and ends: (monotonic time, steps, GPU joules by
    index, CPU joules) at its first and its latest report, and at its first output line."""

    first: tuple[float, int, dict, float] | None = None
    last: tuple[float, int, dict, float] | None = None
    output: tuple[float, dict, float] | None = None

    def report(self, steps: int | None, gpu: dict, cpu_j: float) -> None:
        mark = (time.monotonic(), int(steps or 0), gpu, cpu_j)
        if self.first is None:
            self.first = mark
        self.last = mark

    def window(self, gpus: list[int], end: tuple[float, dict, float]) -> dict[str, Any]:
        """From the first report to the latest (steps counted after the first), where the
        steps grew between them; else from the first output line to the end, as one run;
        else empty (the whole run is the window)."""

        def span(a: tuple, b: tuple, amount: float, origin: str) -> dict[str, Any]:
            (t0, g0, c0), (t1, g1, c1) = a, b
            return {
                "from": origin,
                "s": t1 - t0,
                "amount": amount,
                "gpu_j": sum(g1[i] - g0[i] for i in gpus if i in g0 and i in g1),
                "cpu_j": c1 - c0,
            }

        a, b = self.first, self.last
        if a and b and b[1] > a[1] and b[0] > a[0]:
            return span((a[0], a[2], a[3]), (b[0], b[2], b[3]), b[1] - a[1], "first report")
        if self.first is None and self.output is not None and end[0] > self.output[0]:
            return span(self.output, end, 1.0, "first output line")
        return {}
