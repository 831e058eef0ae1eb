"""``python -m bench figures``: draws the page's plots from the stored results.

One function per figure of docs/BENCHMARKS.md that the measurement suites do not draw themselves.
Each reads the JSON (or text) the page cites under ``--results`` (``docs/results`` by default) and
writes a small PNG next to it; nothing is measured and no number is typed in here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import mean

from bench.figure_goals import goals
from bench.figure_goodput import goodput, to_sb3
from bench.figure_kit import (
    H100,
    H200,
    SIZE,
    TWO_CORE,
    _label_bars,
    _load,
    _plt,
    _save,
    _suptitle,
    _title,
)

HELP = "draws the page's plots from the stored results"


def end_to_end(results: Path) -> Path:
    src = results / "end-to-end" / "ant-e2e.json"
    d = _load(src)
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE)
    names = [
        "raw random-action\nstepping",
        "trained, steady\n(30-90 % of run)",
        "trained, whole run\n(start-up included)",
    ]
    values = [
        d["raw_steps_per_s"],
        d["trained_steps_per_s_steady"],
        d["trained_steps_per_s_whole_run"],
    ]
    bars = ax.bar(names, values, color=["grey", "tab:blue", "tab:blue"])
    _label_bars(ax, bars)
    ax.text(1, values[1] / 2, f"{d['ratio_steady_to_raw']:.2f} of raw", ha="center", color="w")
    ax.text(2, values[2] / 2, f"{d['ratio_whole_run_to_raw']:.2f} of raw", ha="center", color="w")
    ax.set_ylabel("env steps/s")
    ax.set_ylim(0, max(values) * 1.15)
    _title(
        ax,
        f"{d['env']}, {d['actors']} actors x {d['envs_per_actor']} envs: training vs raw "
        f"stepping ({H100})",
    )
    return _save(fig, src.with_suffix(".png"))


def _two_core_seeds(path: Path) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    cartpole, pendulum = [], []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split()
        if f[0] == "pendulum":
            pendulum.append((f[1], float(f[2])))
        else:
            cartpole.append((f[0], float(f[1])))
    return cartpole, pendulum


def cli_defaults(results: Path) -> Path:
    folder = results / "learning" / "defaults"
    cartpole, pendulum = _two_core_seeds(folder / "seeds-2core.txt")
    h100 = {
        "CartPole-v1": _load(folder / "cartpole-h100.json"),
        "Pendulum-v1": _load(folder / "pendulum-h100.json"),
    }
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=SIZE, gridspec_kw={"width_ratios": [3, 2]})
    for ax, env, rows, goal in (
        (axes[0], "CartPole-v1", cartpole, None),
        (axes[1], "Pendulum-v1", pendulum, -400.0),
    ):
        h = h100[env]
        labels = [f"{s}" for s, _ in rows] + [f"{h['config']['seed']}\nH100"]
        values = [r for _, r in rows] + [h["return_mean"]]
        colors = ["tab:blue"] * len(rows) + ["tab:green"]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)), labels)
        if goal is not None:
            ax.axhline(goal, color="tab:red", ls="--", lw=1, label=f"goal {goal:g}")
            ax.set_ylim(min(goal, *values) * 1.15, 0)
            ax.legend(loc="lower right")
        else:
            ax.set_ylim(0, max(values) * 1.1)
        ax.set_title(env)
    fig.supxlabel("seed (blue: 2-core machine; green: H100 host)", fontsize=8)
    axes[0].set_ylabel("mean return, last 100 episodes")
    _suptitle(fig, f"autotune train with its defaults: final return per seed ({TWO_CORE}, {H100})")
    return _save(fig, folder / "returns-per-seed.png")


def pipeline(results: Path) -> Path:
    folder = results / "pipeline"
    runs = [
        (f"H100 host, {d['producers']} producers", d)
        for d in [_load(folder / "pipeline-h100.json")]
    ] + [
        (f"2-core, {d['producers']} producers", d) for d in [_load(folder / "pipeline-2core.json")]
    ]
    plt = _plt()
    sizes = list(dict.fromkeys(r["size"] for r in runs[0][1]["rows"]))
    modes = list(dict.fromkeys(r["mode"] for r in runs[0][1]["rows"]))
    fig, axes = plt.subplots(1, len(sizes), figsize=SIZE, sharey=True)
    width = 0.8 / len(runs)
    for ax, size in zip(axes, sizes, strict=True):
        for i, (label, d) in enumerate(runs):
            by_mode = {r["mode"]: r for r in d["rows"] if r["size"] == size}
            xs = [m + (i - (len(runs) - 1) / 2) * width for m in range(len(modes))]
            ax.bar(xs, [by_mode[m]["rollouts_per_s"] for m in modes], width, label=label)
        kb = next(r["rollout_kb"] for r in runs[0][1]["rows"] if r["size"] == size)
        ax.set_xticks(range(len(modes)), modes)
        ax.set_yscale("log")
        ax.set_xlabel("transport")
        ax.set_title(f"{size} rollouts ({kb:g} KB)")
    axes[0].set_ylabel("rollouts/s reaching the consumer")
    axes[0].legend(loc="upper right")
    _suptitle(fig, f"Stage pipeline, synthetic rollouts, 3 s per mode ({H100}; {TWO_CORE})")
    return _save(fig, folder / "pipeline.png")


def gmi_sms(results: Path) -> Path:
    folder = results / "gmi"
    series = [
        ("256:128:64, 8 actors (H100)", _load(folder / "ant-small-8-actors.json")),
        ("512:512:512:256, 15 actors (H100)", _load(folder / "ant-heavy.json")),
        ("2048:2048:2048, 15 actors (H200)", _load(folder / "sm-bound-2xh200.json")),
    ]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=SIZE)
    for label, d in series:
        rows = sorted(
            (r for r in d["rows"] if r["device"] == "cuda" and r["gmis"] == 1),
            key=lambda r: r["sms"][0],
        )
        sms = [r["sms"][0] for r in rows]
        (line,) = axes[0].plot(sms, [r["sampled_per_s"] for r in rows], "o-", label=label)
        axes[1].plot(sms, [r["steps_per_joule"] for r in rows], "o-", color=line.get_color())
        cpu = [r for r in d["rows"] if r["device"] == "cpu" and r["gmis"] == 1]
        if cpu:
            axes[1].axhline(
                cpu[0]["steps_per_joule"],
                color=line.get_color(),
                ls=":",
                lw=1,
                label="256:128:64, CPU trainer",
            )
    for ax, ylabel in ((axes[0], "sampled env steps/s"), (axes[1], "trained steps/J")):
        ax.set_xscale("log")
        ax.set_xticks([12, 32, 66, 132], ["12", "32", "66", "132"])
        ax.minorticks_off()
        ax.set_xlabel("SMs granted to the trainer GMI (MPS)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.4)
    axes[0].legend(loc="upper center", fontsize=6)
    axes[1].legend(loc="upper center", fontsize=6)
    _suptitle(fig, f"Ant-v5, one trainer GMI vs SMs granted ({H100}; {H200}, GPU 0)")
    return _save(fig, folder / "throughput-vs-sms.png")


def mps_change(results: Path) -> Path:
    src = results / "gmi" / "mps-change.json"
    d = _load(src)
    sms = {g["generation"]: g["sm_count"] for g in d["gmis"]}
    phases = d["phases"]
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=SIZE, sharex=True)
    for ax, key, ylabel in (
        (axes[0], "steps_per_s", "trained steps/s"),
        (axes[1], "gpu_w", "GPU W (NVML)"),
    ):
        for p in phases:
            ax.hlines(p[key], p["start_s"], p["end_s"], color="tab:blue", lw=2)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(p[key] for p in phases) * 1.25)
        for p in phases[1:]:
            ax.axvline(p["start_s"], color="grey", ls="--", lw=1)
    for p in phases:
        pct = p["mps_pct"][0]
        share = "no MPS limit" if pct is None else f"MPS {pct} %"
        axes[0].text(
            (p["start_s"] + p["end_s"]) / 2,
            p["steps_per_s"] * 1.05,
            f"GMI g{p['generation']}: {share}, {sms[p['generation']]} SMs",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    axes[1].set_xlabel("seconds into the run (phase means; phase 0 includes start-up)")
    _suptitle(
        fig, f"{d['env']}, 512-wide policy: the trainer GMI replaced at another MPS share ({H100})"
    )
    return _save(fig, src.with_suffix(".png"))


def grad_sync(results: Path) -> Path:
    folder = results / "grad-sync"
    names = {
        "multi-process-reduction": "MPR",
        "multi-ring-reduction": "MRR",
        "hierarchical-reduction": "HAR",
    }
    layouts = [_load(folder / f) for f in ("sync-2gpus-x1.json", "sync-2gpus-x2.json")]
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE)
    width = 0.8 / len(names)
    for i, (key, short) in enumerate(names.items()):
        xs = [j + (i - 1) * width for j in range(len(layouts))]
        bars = ax.bar(
            xs, [d["results"][key]["sync_ms_median"] for d in layouts], width, label=short
        )
        _label_bars(ax, bars, "{:.2f}")
    labels = [
        f"{len(d['layout'])} GPUs x {len(d['layout'][0])} GMIs\n"
        f"(Algorithm 1 picks {names[d['algorithm1_choice']]})"
        for d in layouts
    ]
    ax.set_xticks(range(len(layouts)), labels)
    ax.set_ylabel("median time of one gradient sync (ms)")
    ax.legend(title="strategy")
    params = layouts[0]["results"]["multi-ring-reduction"]["params"]
    _title(
        ax,
        f"Gradient sync, {layouts[0]['policy']} MLP ({params:,} params), "
        f"{layouts[0]['steps']} steps ({H200})",
    )
    return _save(fig, folder / "sync-time.png")


def actor_inference(results: Path) -> Path:
    folder = results / "inference"
    call = _load(folder / "actor-policy-call.json")
    setups = [
        ("256 wide,\nCPU trainer", "inference_ant15.json", "cpu"),
        ("256 wide,\ncuda trainer", "inference_ant15.json", "cuda"),
        ("256 wide, cuda,\n8 actors", "inference_ant8.json", "cuda"),
        ("512 wide,\ncuda trainer", "inference_heavy.json", "cuda"),
        ("512 wide, MPS\n50 % + 25 %", "inference_heavy_mps.json", "cuda"),
    ]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=SIZE, gridspec_kw={"width_ratios": [2, 3]})
    ax = axes[0]
    envs = [r["envs"] for r in call["rows"]]
    for i, lib in enumerate(("torch", "numpy")):
        xs = [j + (i - 0.5) * 0.4 for j in range(len(envs))]
        ax.bar(xs, [r["us_per_call"][lib] for r in call["rows"]], 0.4, label=lib)
    ax.set_xticks(range(len(envs)), [str(e) for e in envs])
    ax.set_xlabel("envs per actor (observations per call)")
    ax.set_ylabel("one policy call on one core (µs)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
    ax.set_title(f"policy call, {call['policy'].replace('auto:', '').replace(':auto', '')}")
    ax.legend()
    ax = axes[1]
    for j, (_label, name, device) in enumerate(setups):
        rows = {r["inference"]: r for r in _load(folder / name)["rows"] if r["device"] == device}
        for i, where in enumerate(("actor", "gmi")):
            if where in rows:
                ax.barh(
                    j + (i - 0.5) * 0.4,
                    rows[where]["steps_per_joule"],
                    0.4,
                    color="tab:blue" if where == "actor" else "tab:orange",
                    label=("on the actors" if where == "actor" else "inference GMI")
                    if j == 0
                    else None,
                )
    ax.set_yticks(range(len(setups)), [s[0] for s in setups], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("trained steps/J (torch actors)")
    ax.set_title("Ant-v5 training, 15 actors unless noted")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.4)
    ax.legend(loc="center right", title="actions computed")
    _suptitle(fig, f"Where actions are computed, Ant-v5 ({H100})")
    return _save(fig, folder / "where-actions.png")


def cuda_context(results: Path) -> Path:
    src = results / "cuda-context" / "gpu-idle-power.json"
    d = _load(src)
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE)
    phases = list(d["mean_w"])
    values = [mean(d["mean_w"][p].values()) for p in phases]
    colors = ["grey" if "no context" in p else "tab:red" for p in phases]
    bars = ax.bar([p.replace(", ", ",\n").replace(" through", "\nthrough") for p in phases], values)
    for bar, c in zip(bars, colors, strict=True):
        bar.set_color(c)
    _label_bars(ax, bars, "{:.1f} W")
    ax.set_ylabel("GPU power, NVML (W)")
    ax.set_ylim(0, max(values) * 1.15)
    _title(
        ax,
        f"GPU power with and without an idle CUDA context, {d['seconds']:g} s per phase "
        f"(no env; {H100})",
    )
    return _save(fig, src.with_suffix(".png"))


def wrap(results: Path) -> Path:
    """The wrap guide's two full runs: the script's defaults and the exported config."""
    runs = {
        label: _load(results / "wrap-guide" / f"full-{name}.json")["trials"][0]
        for label, name in (("script's defaults", "defaults"), ("exported config", "best"))
    }
    labels = list(runs)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=SIZE)
    ax = axes[0]
    whole = [r["steps"] / (r["gpu_j"] + r["cpu_j"]) for r in runs.values()]
    window = [r["objective"] for r in runs.values()]
    x = range(len(labels))
    bars = ax.bar([i - 0.2 for i in x], window, 0.4, label="first report to last")
    _label_bars(ax, bars, "{:,.0f}")
    bars = ax.bar([i + 0.2 for i in x], whole, 0.4, label="whole run, imports included")
    _label_bars(ax, bars, "{:,.0f}")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("steps/J")
    ax.set_ylim(0, max(window) * 1.15)
    ax.legend()
    ax = axes[1]
    bars = ax.bar(labels, [r["wall_s"] for r in runs.values()], color="tab:gray")
    _label_bars(ax, bars, "{:.1f} s")
    ax.set_ylabel("wall time of 200k steps (s)")
    _suptitle(fig, f"autotune wrap: the PPO example's export re-run at full length ({H100})")
    return _save(fig, results / "wrap-guide" / "wrap-guide.png")


# The goals: which stored runs the page counts for each workload (its "Against the limit" sections).


FIGURES: dict[str, Callable[[Path], Path]] = {
    "end-to-end": end_to_end,
    "cli-defaults": cli_defaults,
    "pipeline": pipeline,
    "gmi-sms": gmi_sms,
    "mps-change": mps_change,
    "grad-sync": grad_sync,
    "actor-inference": actor_inference,
    "cuda-context": cuda_context,
    "wrap": wrap,
    "goals": goals,
    "goodput": goodput,
    "to-sb3": to_sb3,
}


def add_args(ap) -> None:
    ap.add_argument(
        "--results",
        default="docs/results",
        metavar="DIR",
        help="the stored results; each PNG is written next to the JSON it is drawn from",
    )
    ap.add_argument(
        "--only",
        default=None,
        metavar="NAME,...",
        help=f"draw only these figures (of: {', '.join(FIGURES)})",
    )


def run(results: str, only: str | None = None) -> list[Path]:
    names = list(FIGURES) if not only else [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(
            f"unknown figure(s) {', '.join(unknown)}; the figures are: {', '.join(FIGURES)}"
        )
    written = []
    for name in names:
        path = FIGURES[name](Path(results))
        print(f"{name}: {path}")
        written.append(path)
    return written
