"""The goals figure of ``python -m bench figures``: every bracketed measurement divided by its
goal's threshold, from the stored comparison reports."""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from bench.figure_kit import (
    H100,
    SIZE,
    _load,
    _plt,
    _save,
)

LIMIT_RUNS = {
    "Ant-v5": [
        ("limits/ant-cpu-trainer", None, ("exported", "exported-cpu")),
        ("limits/ant-rounds", None, ("exported", "exported-cpu")),
        ("limits/nice-mps/ant", None, ("exported",)),
    ],
    "HalfCheetah-v5": [
        ("limits/others-ant-export", "halfcheetah", ("exported",)),
        ("limits/halfcheetah-rounds", None, ("exported",)),
        ("limits/nice-mps/halfcheetah", None, ("exported",)),
    ],
    "GPU-heavy": [
        ("limits/others-ant-export", "ant-heavy", ("exported",)),
        ("limits/others-rounds", "ant-heavy/", ("exported",)),
    ],
    "Humanoid-v5": [
        ("humanoid/actor-nice", None, None),
        ("humanoid/bf16-nice/round1", None, None),
        ("humanoid/bf16-nice/round2", None, None),
        ("humanoid/cpu-trainer", None, None),
        ("humanoid/from-ant-export", None, None),
        ("humanoid/own-export-confirmed", None, None),
        ("limits/nice-mps/humanoid", None, None),
        ("limits/others-ant-export", "humanoid", ("exported",)),
        ("limits/others-rounds", "humanoid/", ("exported",)),
    ],
}
NOT_ARMS = ("limit", "limit-end", "sb3-cpu", "sb3-cuda", "cleanrl", "default", "tuned")


def _limit_ratios(results: Path, key: str) -> dict[str, list[float]]:
    """Every counted measurement of ``key`` per workload (None arms: every config tried)."""
    out: dict[str, list[float]] = {}
    for workload, runs in LIMIT_RUNS.items():
        for folder, run, arms in runs:
            for g in _load(results / folder / "report.json")["groups"]:
                if run is not None and not g["run"].startswith(run):
                    continue
                for arm, r in g["ratios"].items():
                    if (arms is None and arm not in NOT_ARMS) or (arms and arm in arms):
                        out.setdefault(workload, []).append(r[key])
    return out


def _spent_j(doc: dict) -> float:
    """The joules a run took to its target, or where it never reached it all it spent
    (``goodput_report.spent_joules``): a lower bound of what it would have taken."""
    from bench.goodput_report import spent_joules

    target = doc["target"]
    return target["joules"] if target["reached"] else spent_joules(doc)


def _goodput_over_steps_j(results: Path) -> list[float]:
    """Steps/J tuning's joules to 1,000 over goodput tuning's, per seed (Ant-v5, H200)."""
    folder = results / "goodput" / "ant-h200"
    return [
        _spent_j(_load(folder / f"steps-per-joule-seed{s}.json"))
        / _spent_j(_load(folder / f"goodput-seed{s}.json"))
        for s in range(3)
    ]


def _sb3_over_ours(results: Path) -> list[float]:
    """SB3 PPO's joules for its first 1M steps over each run's to SB3's 1M-step return, SB3
    measured in the run's own command (Ant-v5, H200): every run, first runs and runs without
    torch's bytecode too."""
    out = []
    for folder in sorted((results / "goodput" / "to-390-bytecode-h200").iterdir()):
        sb3_j = 1e6 / _load(folder / "sb3.json")["steps_per_joule"]
        out += [sb3_j / _spent_j(_load(f)) for f in sorted(folder.glob("goodput-seed*.json"))]
    return out


def goals(results: Path) -> Path:
    e2e = _load(results / "end-to-end" / "ant-e2e.json")
    peers = _load(results / "peers" / "ant" / "report.json")["groups"][0]["ratios"]["exported"]
    others = _load(results / "limits" / "others-ant-export" / "report.json")["groups"]
    tuning = _load(results / "tuning" / "online" / "report.json")
    side = tuning["side_by_side"]
    tuned = mean(v["steps_per_joule"] for k, v in side.items() if k.startswith("fixed-tuned"))
    grid = mean(v["steps_per_joule"] for k, v in side.items() if k.startswith("fixed-grid"))
    rows: list[tuple[str, float, dict[str, list[float]]]] = [
        ("trained/raw rate", 0.6, {"Ant-v5": [e2e["ratio_whole_run_to_raw"]]}),
        ("steps/s / limit", 0.8, _limit_ratios(results, "steps_per_s_vs_limit")),
        ("steps/J / limit", 0.8, _limit_ratios(results, "steps_per_joule_vs_limit")),
        (
            "steps/J / SB3 best",
            7.0,
            {
                "Ant-v5": [peers["steps_per_joule_vs_sb3_best"]],
                **{
                    {"halfcheetah": "HalfCheetah-v5", "humanoid": "Humanoid-v5"}.get(
                        g["run"], "GPU-heavy"
                    ): [g["ratios"]["exported"]["steps_per_joule_vs_sb3_best"]]
                    for g in others
                },
            },
        ),
        ("online tuned / default", 1.3, {"Ant-v5": [tuning["vs_default"]]}),
        ("online tuned / grid best", 0.9, {"Ant-v5": [tuning["vs_grid_best"], tuned / grid]}),
        ("J to 1,000: steps/J / goodput", 1.3, {"Ant-v5": _goodput_over_steps_j(results)}),
        ("J to its return: SB3 / ours", 10.0, {"Ant-v5": _sb3_over_ours(results)}),
    ]
    colors = {
        "Ant-v5": "tab:blue",
        "HalfCheetah-v5": "tab:green",
        "GPU-heavy": "tab:purple",
        "Humanoid-v5": "tab:orange",
    }
    offsets = {w: (i - 1.5) * 0.15 for i, w in enumerate(colors)}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(SIZE[0], 4.4))
    for y, (_name, goal, by_workload) in enumerate(rows):
        for workload, values in by_workload.items():
            xs = [v / goal for v in values]
            ax.scatter(
                xs,
                [y + offsets[workload]] * len(xs),
                s=14,
                color=colors[workload],
                alpha=0.8,
                label=workload if y == 2 else None,
            )
    ax.axvline(1.0, color="tab:red", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), [f"{n} ≥ {g:g}" for n, g, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("measured / goal (log; right of the red line: met)")
    ax.legend(loc="upper right", title="workload")
    ax.set_title(  # short lines: the axes sit right of the long row names
        f"Every counted run against its goal\n(Humanoid-v5: every config tried)\n{H100};"
        "\nthe last two rows: H200, 16-core host",
        fontsize=9,
    )
    return _save(fig, results / "limits" / "goals.png")
