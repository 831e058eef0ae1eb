"""A suite's work as a list of named steps, run in parts that resume.

``run_suite`` runs the steps in order. With ``--state DIR`` each finished step's result is kept
there, and the same command run again skips the finished steps and goes on; with ``--part-s N``
a step whose estimate does not fit in what is left of N seconds is left for the next run, and
the command ends (exit 0) saying how many steps are left. A state dir remembers the command it
belongs to and refuses any other. Steps that need a GPU are skipped, saying so, where NVML sees
none. After every step the suite's result document is written again (``bench/report.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import write_result
from runtime.hw.gpus import no_gpu_reason

RUN_FLAGS = ("--state", "--part-s")
"""Flags that say how a suite runs, not what it measures: left out of a state dir's command."""


@dataclass
class Step:
    """One named piece of a suite: ``run()`` returns its result (JSON-able)."""

    name: str
    run: Callable[[], Any]
    estimate_s: float
    needs_gpu: bool = False


class NotFinished(Exception):
    """Raised by a step that stopped before the end and goes on when the command runs again."""

    def __init__(self, result: Any, why: str) -> None:
        super().__init__(why)
        self.result = result


@functools.lru_cache(maxsize=1)
def gpu_missing() -> str | None:
    """Why no GPU can be used here (None where NVML sees one), asked once."""
    return no_gpu_reason()


def print_table(table: Callable[[dict], str], markdown: str | None) -> Callable[[dict], None]:
    """A suite's ``finish``: prints ``table(results)`` and writes it to ``markdown`` if given."""

    def finish(results: dict) -> None:
        text = table(results)
        print(text)
        if markdown:
            Path(markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(markdown).write_text(text)

    return finish


def command_key(suite: str, argv: list[str]) -> list[str]:
    """The command a state dir belongs to: the suite and its flags, less ``RUN_FLAGS``."""
    out, skip = [suite], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in RUN_FLAGS:
            skip = True
            continue
        if arg.split("=", 1)[0] in RUN_FLAGS:
            continue
        out.append(arg)
    return out


class State:
    """Finished steps' results: in ``DIR/steps/`` with a state dir, else in memory."""

    def __init__(self, path: Path | None, key: list[str]) -> None:
        self.path, self.memory = path, {}
        if path is None:
            return
        path.mkdir(parents=True, exist_ok=True)
        command = path / "command.json"
        if command.exists():
            theirs = json.loads(command.read_text())
            if theirs != key:
                raise SystemExit(
                    f"--state {path}: it belongs to another command ({' '.join(theirs)}), not "
                    f"this one ({' '.join(key)}); run that command, or give a fresh --state"
                )
        else:
            command.write_text(json.dumps(key) + "\n")
        (path / "steps").mkdir(exist_ok=True)

    def _file(self, name: str) -> Path:
        assert self.path is not None
        return self.path / "steps" / f"{name.replace('/', '__')}.json"

    def done(self, name: str) -> bool:
        return name in self.memory if self.path is None else self._file(name).exists()

    def result(self, name: str) -> Any:
        if self.path is None:
            return self.memory[name]
        return json.loads(self._file(name).read_text())["result"]

    def record(self, name: str, result: Any) -> None:
        if self.path is None:
            self.memory[name] = result
            return
        tmp = self._file(name).with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": name, "result": result}) + "\n")
        tmp.replace(self._file(name))


def run_suite(
    suite: str,
    steps: list[Step],
    a: argparse.Namespace,
    argv: list[str],
    finish: Callable[[dict[str, Any]], Any] | None = None,
) -> int:
    """Runs what is left of ``steps`` (see the module docstring); returns the exit code: 0, or
    1 where a step's result says ``"failed": true``."""
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise SystemExit(f"{suite}: two steps share a name in {names}")
    if a.part_s and not a.state:
        raise SystemExit("--part-s N needs --state DIR, where the finished steps are kept")
    state = State(Path(a.state) if a.state else None, command_key(suite, argv))
    out_dir = Path(a.out)
    t0, ran, skipped = time.monotonic(), 0, []
    stopped = None
    for step in steps:
        if state.done(step.name):
            print(f"[{suite}] {step.name}: done in an earlier part, skipped", flush=True)
            continue
        if step.needs_gpu and (why := gpu_missing()):
            print(f"[{suite}] {step.name}: skipped, it needs a GPU: {why}", flush=True)
            skipped.append(step.name)
            continue
        if a.part_s:
            left = a.part_s - (time.monotonic() - t0)
            if step.estimate_s > left:
                if not ran and step.estimate_s > a.part_s:
                    raise SystemExit(
                        f"{suite}: step {step.name} takes about {step.estimate_s:.0f} s, more "
                        f"than --part-s {a.part_s:g}: give a larger --part-s or a shorter step"
                    )
                stopped = f"step {step.name} (about {step.estimate_s:.0f} s) does not fit"
                break
        print(f"[{suite}] {step.name}: running (about {step.estimate_s:.0f} s)", flush=True)
        try:
            result = step.run()
        except NotFinished as exc:
            stopped = f"step {step.name} stopped before its end ({exc})"
            print(f"[{suite}] {step.name}: {exc}", flush=True)
            break
        state.record(step.name, result)
        ran += 1
        _write(suite, steps, state, out_dir, argv)
    left = [s.name for s in steps if not state.done(s.name) and s.name not in skipped]
    if left:
        print(
            f"[{suite}] {stopped}. {len(left)} steps left; run the same command again "
            f"(left: {', '.join(left)})",
            flush=True,
        )
        return 0
    results = _write(suite, steps, state, out_dir, argv)
    if finish is not None:
        finish(results)
    failed = [n for n, r in results.items() if isinstance(r, dict) and r.get("failed")]
    note = f"; skipped without a GPU: {', '.join(skipped)}" if skipped else ""
    print(f"[{suite}] all steps done{note}; results in {out_dir / (suite + '.json')}", flush=True)
    if failed:
        print(f"[{suite}] failed steps: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def _write(suite, steps, state, out_dir, argv) -> dict[str, Any]:
    results = {s.name: state.result(s.name) for s in steps if state.done(s.name)}
    write_result(out_dir, suite, results, [suite, *argv])
    return results
