"""Terminal output of ``autotune train``: a live progress line and the final summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runtime.config import TrainConfig
from runtime.runner import RunState

REFRESH_S = 0.5


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


class ProgressDisplay:
    """A rich ``Live`` view refreshed from the runner's progress callback."""

    def __init__(
        self, console: Console, cfg: TrainConfig, enabled: bool = True, steps_before: int = 0
    ) -> None:
        self.console, self.cfg, self.enabled = console, cfg, enabled
        self.steps_before = steps_before
        """Trained steps of the runs before (a run resumed from a checkpoint)."""
        self.live = Live(console=console, refresh_per_second=4, transient=False)
        self._last_render = 0.0
        self._rate_mark: tuple[float, int] = (0.0, 0)
        self._rate = 0.0

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.live.__exit__(*exc)

    def update(self, state: RunState) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last_render < REFRESH_S:
            return
        t0, s0 = self._rate_mark
        if state.elapsed_s > t0:
            self._rate = (state.trained_steps - s0) / (state.elapsed_s - t0)
        self._rate_mark = (state.elapsed_s, state.trained_steps)
        self._last_render = now
        phase = "[yellow]draining[/yellow]" if state.draining else "[green]training[/green]"
        line = Text.from_markup(
            f"{phase} {self.steps_before + state.trained_steps:,}/{self.cfg.steps:,} trained "
            f"({state.sampled_steps:,} sampled)  {self._rate:,.0f} steps/s  "
            f"return {_fmt(state.return_mean, '.1f')} ({state.episodes:,} ep)  "
            f"lag {state.policy_lag_mean:.1f}/{state.policy_lag_max}  "
            f"restarts {state.actor_restarts}  {state.elapsed_s:,.0f}s"
        )
        self.live.update(line)


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
            f"{result['discarded_steps']:,} / {result['lost_steps']:,}",
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
