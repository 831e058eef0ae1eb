"""The goodput figure of ``python -m bench figures``: mean return against the joules spent, for
runs tuned by steps per joule and by goodput per joule to a target return.

It reads the progress files (``autotune train --progress``, whose lines carry the joules of the
run and of the runs its checkpoint went on from) and the result documents stored under
``goodput/ant-h200/``; nothing is typed in here but the line of SB3 PPO's return at 1M steps,
the mean of ``learning/vs-sb3/table.md`` (whose progress files are not kept).
"""

from __future__ import annotations

from pathlib import Path

from autotune.workflows.progress_log import read_progress
from bench.figure_kit import SIZE, _load, _plt, _save, _title

SB3_RETURN_1M = 390.0
"""SB3 PPO's mean return on Ant-v5 at 1M steps, 3 seeds (``learning/vs-sb3/table.md``)."""
ARMS = {
    "steps-per-joule": ("tuned by steps/J", "tab:blue"),
    "goodput": ("tuned by goodput/J", "tab:green"),
}


def goodput(results: Path) -> Path:
    """The page's figure, from the runs stored under ``goodput/ant-h200/``."""
    src = results / "goodput" / "ant-h200"
    title = "Ant-v5 to a return of 1,000: tuned by steps/J and by goodput/J (H200, 16-core host)"
    return return_vs_joules(src, src / "return-vs-joules.png", 1000.0, SB3_RETURN_1M, title)


def return_vs_joules(
    src: Path,
    png: Path,
    target: float,
    reference: float | None,
    title: str,
    seeds: list[int] | None = None,
    arms: list[str] | None = None,
    reference_label: str = "SB3 PPO's return at 1M steps",
) -> Path:
    """Mean return against joules for every ``<arm>-seed<S>.progress.jsonl`` in ``src`` (the
    arms of ``ARMS``, or of ``arms``; the seeds in ``seeds`` where given; not a run marked
    failed, ``<arm>-seed<S>.failed``), a dotted line where a run reached ``target`` (its
    result document beside it), and ``reference`` as a dashed line (``reference_label``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE)
    for arm, (label, colour) in ARMS.items():
        if arms is not None and arm not in arms:
            continue
        for path in sorted(src.glob(f"{arm}-seed*.progress.jsonl")):
            seed = path.name.split("seed")[1].split(".")[0]
            if seeds is not None and seed not in {str(x) for x in seeds}:
                continue
            if (src / f"{arm}-seed{seed}.failed").is_file():
                continue
            _curve(ax, path, color=colour, label=f"{label}, seed {seed}")
            doc = src / f"{arm}-seed{seed}.json"
            reached = _load(doc).get("target") if doc.is_file() else None
            if reached and reached["reached"]:
                ax.axvline(reached["joules"] / 1000, color=colour, ls=":", lw=1)
    ax.axhline(target, color="gray", lw=0.8)
    if reference is not None:
        ax.axhline(reference, color="gray", lw=0.8, ls="--")
        ax.annotate(
            reference_label,
            (0, reference),
            xytext=(2, 3),
            textcoords="offset points",
            fontsize=7,
            color="gray",
        )
    ax.set_xlabel("joules spent, as each run's progress lines count them (kJ)")
    ax.set_ylabel("mean return, last 100 episodes")
    ax.legend(loc="upper left")
    _title(ax, title)
    return _save(fig, png)


VARIANTS = {
    "suite-settings": ("the suite's settings, KL-steered", "tab:green"),
    "sb3-settings-adaptive": ("SB3's settings, KL-steered", "tab:orange"),
    "sb3-settings": ("SB3's settings, 3e-4 held", "tab:red"),
    "floor-512-constant": ("the suite's settings, 3e-4 held", "tab:olive"),
    "minibatches-128-constant": ("16 minibatches of 128, 3e-4 held", "tab:purple"),
}
"""The learner settings under ``goodput/to-390-h200/`` (folder -> label, colour)."""


def to_sb3(results: Path) -> Path:
    """Return against joules of the goodput-tuned runs to SB3's 1M-step return, per learner
    setting (seed 0 dashed: the first run, which probed; seeds 1 and 2 read its probes), with
    the joules 10x fewer than SB3's 1M steps on the same host (its arm document) marked."""
    src = results / "goodput" / "to-390-h200"
    sb3 = _load(src / "sb3-on-host" / "Ant-v5-sb3-cpu.json")
    tenth = 1e6 / sb3["steps_per_joule"] / 10 / 1000  # kJ
    plt = _plt()
    fig, ax = plt.subplots(figsize=SIZE)
    for folder, (label, colour) in VARIANTS.items():
        for path in sorted((src / folder).glob("goodput-seed*.progress.jsonl")):
            first = path.name.startswith("goodput-seed0.")
            style = {"ls": "--" if first else "-", "lw": 0.9, "label": label if first else None}
            _curve(ax, path, color=colour, **style)
    ax.axhline(SB3_RETURN_1M, color="gray", lw=0.8)
    ax.axvline(tenth, color="black", lw=0.8, ls=":")
    ax.annotate(
        f"10x fewer joules than SB3's 1M steps ({tenth:.2f} kJ)",
        (tenth, SB3_RETURN_1M),
        xytext=(3, 8),
        textcoords="offset points",
        fontsize=7,
    )
    ax.set_xlabel("joules from the process's start, probes included (kJ)")
    ax.set_ylabel("mean return, last 100 episodes")
    ax.legend(loc="lower right", fontsize=7)
    _title(ax, "Ant-v5 to SB3's 1M-step return (390), goodput-tuned (H200, 16-core host)")
    return _save(fig, src / "return-vs-joules.png")


def _curve(ax, path: Path, **style) -> None:
    """A run's mean return against its joules (kJ), from its progress lines."""
    rows = [r for r in read_progress(path) if r.get("joules") and r.get("return") is not None]
    ax.plot([r["joules"] / 1000 for r in rows], [r["return"] for r in rows], **style)
