"""How much a run keeps training through a fault: one CartPole (or any env) run per role, the
role's process SIGKILLed partway, beside an unfaulted run of the same length.

For each faulted run, ``after`` is the steps it trained from the kill to its end, and ``same
span`` what the unfaulted run trained over the same seconds of its own run (its timeline,
interpolated); their ratio is what the fault cost (steps a trainer restart rolled back are
not among them). ``recovery_s`` is the time from the kill to the first trained step reported
after it. Every run's accounting must stay exact.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

ROLES = ("none", "actor", "compressor", "migrator", "trainer")


def _process(runner: Any, role: str) -> int:
    if role == "actor":
        return runner.slots[0].process.pid
    if role == "trainer":
        return dict(runner.services.items())[runner.trainer_names()[0]].pid
    return dict(runner.services.items())[role].pid


def fault_run(env: str, role: str, seconds: float, kill_at_s: float, **cfg: Any) -> dict:
    """One run of ``seconds`` wall, ``role`` killed at ``kill_at_s`` (``none``: unfaulted)."""
    from runtime.config import TrainConfig
    from runtime.gmi.role import recovery_file
    from runtime.runner import Runner

    config = TrainConfig(env=env, steps=10**12, max_wall_s=seconds, **cfg)
    marks: dict[str, Any] = {}
    runner: Runner

    def progress(state: Any) -> None:
        done = state.trained_steps + state.rolled_back_steps  # a rollback is no step trained
        if "kill_s" in marks and "back_s" not in marks and done > marks["done"]:
            marks["back_s"] = state.elapsed_s
        if role == "none" or "kill_s" in marks:
            return
        ready = role != "trainer" or os.path.exists(recovery_file(runner.run_dir))
        if state.elapsed_s >= kill_at_s and ready:
            os.kill(_process(runner, role), signal.SIGKILL)
            marks.update(kill_s=state.elapsed_s, steps=state.trained_steps, done=done)

    runner = Runner(config, config.validate(), on_progress=progress)
    started = time.monotonic()
    result = runner.run()
    rows = result["timeline"]["rows"]
    return {
        "role": role,
        "wall_s": time.monotonic() - started,
        "kill_s": marks.get("kill_s"),
        "steps_at_kill": marks.get("steps"),
        "recovery_s": marks["back_s"] - marks["kill_s"] if "back_s" in marks else None,
        "trained": result["env_steps"],
        "sampled": result["sampled_steps"],
        "discarded": result["discarded_steps"],
        "lost": result["lost_steps"],
        "exact": result["sampled_steps"]
        == result["env_steps"] + result["discarded_steps"] + result["lost_steps"],
        "replacements": result.get("service_replacements", []),
        "actor_restarts": result["actor_restarts"],
        "timeline": [[r[0], r[1]] for r in rows],
        "end_s": rows[-1][0] if rows else 0.0,
    }


def steps_between(timeline: list[list[float]], t0: float, t1: float) -> float:
    """Trained steps between ``t0`` and ``t1`` seconds into a run (its timeline, linear)."""
    t = np.array([r[0] for r in timeline], float)
    s = np.array([r[1] for r in timeline], float)
    if len(t) < 2:
        return 0.0
    return float(np.interp(t1, t, s) - np.interp(t0, t, s))


def compare(runs: dict[str, dict]) -> list[dict]:
    """Each faulted run beside the unfaulted one over the same span (see the docstring)."""
    base = runs.get("none")
    rows = []
    for role, run in runs.items():
        if role == "none" or run.get("kill_s") is None or base is None:
            continue
        after = run["trained"] - run["steps_at_kill"]
        same = steps_between(base["timeline"], run["kill_s"], run["end_s"])
        rows.append(
            {
                "role": role,
                "kill_s": run["kill_s"],
                "after": after,
                "same_span": same,
                "ratio": after / same if same > 0 else None,
                "recovery_s": run["recovery_s"],
                "lost": run["lost"],
                "exact": run["exact"],
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| process killed | at (s) | trained after | unfaulted, same span | ratio | "
        "first trained step after (s) | lost steps | accounting exact |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        rec = f"{r['recovery_s']:.1f}" if r["recovery_s"] is not None else "-"
        out.append(
            f"| {r['role']} | {r['kill_s']:.1f} | {r['after']:,} | {r['same_span']:,.0f} | "
            f"{ratio} | {rec} | {r['lost']:,} | {'yes' if r['exact'] else 'NO'} |"
        )
    return "\n".join(out)
