"""Terminal output of ``autotune train``: a live progress line and the final summary table."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runtime.child_start import ctrl_c_for_main_only, without_ctrl_c
from runtime.config import TrainConfig
from runtime.runner import RunState
from runtime.time_spent import cpu_parts

REFRESH_S = 0.5
PLAIN_EVERY_S = 5.0
"""Without a terminal (CI logs, ``nohup``), a plain progress line this often."""


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


class StderrRelay:
    """While a live line shows, what the run's processes write to stderr (children inherit
    fd 2: an actor's traceback, a warning) goes through a pipe and is printed above the live
    line, a line at a time, instead of onto it. The console writes to the terminal itself."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StderrRelay:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._old_file = self.console.file
        self.console.file = os.fdopen(os.dup(self._saved), "w", buffering=1)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = without_ctrl_c(
            threading.Thread(target=self._pump, args=(read,), daemon=True)
        )
        return self

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "rb") as pipe:
            for raw in iter(pipe.readline, b""):
                text = raw.decode(errors="replace").rstrip("\n")
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        assert self._saved is not None and self._thread is not None
        os.dup2(self._saved, 2)  # the pipe ends once the children holding it have exited
        os.close(self._saved)
        self._thread.join(timeout=1.0)
        self.console.file.flush()
        self.console.file = self._old_file


class ProgressDisplay:
    """A rich ``Live`` view refreshed from the runner's progress callback; without a terminal,
    a plain line every ``PLAIN_EVERY_S`` instead (a log shows the run as it goes)."""

    def __init__(
        self, console: Console, cfg: TrainConfig, enabled: bool = True, steps_before: int = 0
    ) -> None:
        self.console, self.cfg, self.enabled = console, cfg, enabled
        self.steps_before = steps_before
        """Trained steps of the runs before (a run resumed from a checkpoint)."""
        self.live = Live(console=console, refresh_per_second=4, transient=False)
        self.plain = not console.is_terminal
        self.relay = StderrRelay(console)
        self._unprinted: Text | None = None
        self._last_render = 0.0
        self._rate_mark: tuple[float, int] = (0.0, 0)
        self._rate = 0.0

    def __enter__(self) -> ProgressDisplay:
        if self.enabled and not self.plain:
            self.relay.__enter__()
            with ctrl_c_for_main_only():  # its refresh thread
                self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and not self.plain:
            self.live.__exit__(*exc)
            self.relay.__exit__(*exc)
        elif self._unprinted is not None:  # the last state, even if newer than the last line
            self.console.print(self._unprinted)

    def print(self, *objects: Any) -> None:
        """Prints above the live line (not onto it), or as a line of its own without one."""
        (self.live.console if self.enabled and not self.plain else self.console).print(*objects)

    def update(self, state: RunState) -> None:
        now = time.monotonic()
        every = PLAIN_EVERY_S if self.plain else REFRESH_S
        if not self.enabled or now - self._last_render < every:
            if self.enabled and self.plain:
                self._unprinted = self._line(state, self._rate)
            return
        t0, s0 = self._rate_mark
        done = state.trained_steps + state.rolled_back_steps  # a rollback is no negative rate
        if state.elapsed_s > t0:
            self._rate = (done - s0) / (state.elapsed_s - t0)
        self._rate_mark = (state.elapsed_s, done)
        self._last_render = now
        line = self._line(state, self._rate)
        if self.plain:
            self.console.print(line)
            self._unprinted = None
        else:
            self.live.update(line)

    def _line(self, state: RunState, rate: float) -> Text:
        phase = "[yellow]draining[/yellow]" if state.draining else "[green]training[/green]"
        return Text.from_markup(
            f"{phase} {self.steps_before + state.trained_steps:,}/{self.cfg.steps:,} trained "
            f"({state.sampled_steps:,} sampled)  {rate:,.0f} steps/s  "
            f"return {_fmt(state.return_mean, '.1f')} ({state.episodes:,} ep)  "
            f"lag {state.policy_lag_mean:.1f}/{state.policy_lag_max}  "
            f"{_learner(state)}restarts {state.actor_restarts}  {state.elapsed_s:,.0f}s"
        )


def _learner(state: RunState) -> str:
    """The learner's gradient noise scale and learning rate, where it reports them."""
    noise = "" if state.noise_scale is None else f"noise {state.noise_scale:,.0f}  "
    return noise + ("" if state.lr is None else f"lr {state.lr:.2g}  ")


def _waits(result: dict[str, Any]) -> str | None:
    """The actors' waits on their in-flight budget (the timeline's ``actor_throttle_s``):
    seconds summed before the first trained batch (the trainer starting), and the share of
    their time after it (the learner behind); None where the timeline cannot say."""
    timeline = result.get("timeline") or {}
    columns, rows = timeline.get("columns") or [], timeline.get("rows") or []
    actors = (result.get("config") or {}).get("actors")
    if "actor_throttle_s" not in columns or not isinstance(actors, int) or actors < 1:
        return None
    i = columns.index("actor_throttle_s")
    first = next((r for r in rows if r[1] > 0), None)
    if first is None or rows[-1][0] <= first[0]:
        return None
    share = (rows[-1][i] - first[i]) / (actors * (rows[-1][0] - first[0]))
    return f"{first[i]:,.0f} s before the first batch, {share:.1%} of their time after"


def summary_table(result: dict[str, Any]) -> Table:
    """The end-of-run summary: throughput, energy (with sources), returns and the stages."""
    energy = result["energy"]
    table = Table(title=f"autotune train: {result['env']}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    asked = (result.get("config") or {}).get("steps")
    trained = f"{result['env_steps']:,}"
    if isinstance(asked, int) and result["env_steps"] > asked:  # the drain trains what is in flight
        trained += f" ({asked:,} asked; what was in flight then was trained too)"
    rows = [
        ("trained env steps", trained),
        (
            "sampled / discarded / lost",
            f"{result['sampled_steps']:,} / "
            f"{result['discarded_steps']:,} / {result['lost_steps']:,}"
            + (
                f" ({result['rolled_back_steps']:,} of them trained, then rolled back by a "
                "trainer restart)"
                if result.get("rolled_back_steps")
                else ""
            ),
        ),
        ("wall time", f"{result['wall_s']:.1f} s"),
        ("trained steps/s", _fmt(result["steps_per_s"])),
        ("GPU energy", f"{energy['gpu_j']:,.0f} J ({energy['gpu_source']})"),
        ("CPU energy", f"{energy['cpu_j']:,.0f} J ({energy['cpu_source']})"),
        ("steps per joule", _fmt(result["steps_per_joule"], ",.1f")),
        ("return (last 100 episodes)", _fmt(result["return_mean"], ".1f")),
        (
            "policy lag mean / max",
            f"{result['policy_lag']['mean']:.2f} / {result['policy_lag']['max']}",
        ),
        ("actor restarts", str(result["actor_restarts"])),
        ("trainer device", str(result["trainer_device"])),
    ]
    spent = result.get("actor_time") or {}
    if spent.get("cpu_us_per_step") is not None:
        rows.append(
            (
                "actors, summed",
                f"envs {spent['env_s']:,.0f} s, actions {spent['policy_s']:,.0f} s, "
                f"{spent['cpu_us_per_step']:,.0f} us CPU/step",
            )
        )
    split = result.get("minibatches") or {}
    if split.get("at_batch") and split["at_batch"] != split.get("asked"):
        rows.append(
            (
                "minibatches per epoch",
                f"{split['at_batch']} ({split['asked']} asked; --min-minibatch "
                f"{split['min_samples']:,})",
            )
        )
    cpu = result.get("cpu_time")
    if cpu:
        rows.append((f"CPU s (of {cpu['core_s']:,.0f} core-s)", cpu_parts(cpu)))
    waits = _waits(result)
    if waits is not None:
        rows.append(("actors waiting on the learner", waits))
    target = result.get("target")
    if target is not None:
        best = "-" if target["best_return"] is None else f"{target['best_return']:.1f}"
        spent = target if target["reached"] else target.get("spent")
        cost = ""
        if spent:
            cost = f"{spent['steps']:,} steps, {spent['seconds']:.1f} s, {spent['joules']:,.0f} J"
        text = cost if target["reached"] else f"not reached (best 100-episode mean {best})"
        if cost and not target["reached"]:
            text += f" after {cost}"
        rows.append((f"to a return of {target['return']:g}", text))
    noise = result.get("noise_scale") or {}
    if noise.get("samples") is not None:
        rows.append(
            (
                "gradient noise scale",
                f"{noise['samples']:,.0f} samples; batches of {noise['batch_samples']:,} keep "
                f"{noise['efficiency']:.0%} of each sample's worth",
            )
        )
    inference = result.get("inference") or {}
    if inference.get("mode") == "gmi":
        where = inference.get("device") or "?"
        if inference.get("gpu") is not None:
            where += f" {inference['gpu']}, {inference.get('sm_count')} SMs"
        rows.append(
            ("inference GMI", f"{where}, {inference.get('rows_per_batch') or 0:.1f} rows/batch")
        )
    for name, stage in result["stages"].items():
        rows.append(
            (f"stage {name}", f"{stage['messages']:,} msgs, {stage['bytes'] / 1e6:,.1f} MB")
        )
    for row in rows:
        table.add_row(*row)
    return table
