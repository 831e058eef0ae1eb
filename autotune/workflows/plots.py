"""The PNG plots of ``autotune export --plots DIR``: steps/J vs actors, steps/s vs SMs granted,
the Pareto front of steps/s and steps/J, and knob importance (Optuna's PED-ANOVA, for high
steps/J). The figures are the ones export ranks by: scaled by the study's reference runs
(``autotune.tuning.reference``), which equal the raw ones in a study without them."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.tuning.reference import score
from autotune.tuning.storage import config_key
from autotune.workflows.export import run_values

logger = logging.getLogger(__name__)


def _sms_granted(values: dict[str, Any], sm_count: int) -> float | None:
    if values.get("trainer_device", "cuda") != "cuda":
        return None
    gmis = int(values.get("trainers", 1))
    pct = float(values.get("mps_pct", 100))
    return sm_count * min(1.0, gmis * pct / 100.0)


def write_plots(
    study: Any, out_dir: Path, sm_count: int | None, recommended: dict[str, Any] | None = None
) -> list[Path]:
    """Writes the plots of ``study``'s completed trials into ``out_dir``; returns their paths
    (the SM plot only where the study ran on a GPU and its SM count is known)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    meta = study.user_attrs.get("autotune", {})
    fixed = meta.get("fixed", {})
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("steps_per_joule") is not None
    ]
    ran = [run_values(t, fixed) for t in done]  # every knob's value each trial ran with
    rec_key = config_key(recommended) if recommended else None
    spj = [score(t, "steps_per_joule") for t in done]
    sps = [score(t, "steps_per_s") for t in done]
    is_rec = [rec_key is not None and config_key(v) == rec_key for v in ran]
    title = f"{meta.get('env', '')} study {study.study_name}: {len(done)} trials"
    paths = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)

    def mark(ax: Any, xs: list[float], ys: list[float]) -> None:
        rx = [x for x, r in zip(xs, is_rec, strict=True) if r]
        ry = [y for y, r in zip(ys, is_rec, strict=True) if r]
        if rx:
            ax.scatter(rx, ry, s=160, facecolors="none", edgecolors="red", label="recommended")
            ax.legend()

    actors = [v.get("actors") for v in ran]
    if all(a is not None for a in actors):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        envs = [v.get("envs_per_actor", 1) for v in ran]
        sc = ax.scatter(actors, spj, c=envs, cmap="viridis")
        fig.colorbar(sc, ax=ax, label="envs per actor")
        mark(ax, actors, spj)
        ax.set(xlabel="actor processes", ylabel="trained steps per joule", title=title)
        ax.set_xlim(min(actors) - 0.5, max(actors) + 0.5)  # whole processes only
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        save(fig, "steps_per_joule_vs_actors.png")

    if sm_count:
        granted = [(_sms_granted(v, sm_count), t, v) for t, v in zip(done, ran, strict=True)]
        granted = [(g, t, v) for g, t, v in granted if g is not None]
        if granted:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            xs = [g for g, _, _ in granted]
            ys = [score(t, "steps_per_s") for _, t, _ in granted]
            ax.scatter(xs, ys, c=[v.get("actors", 0) for _, _, v in granted], cmap="plasma")
            ax.set(
                xlabel=f"SMs granted to trainer GMIs (of {sm_count}; GMIs x MPS %)",
                ylabel="trained steps per second",
                title=title,
            )
            ax.grid(alpha=0.3)
            save(fig, "steps_per_s_vs_sms.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = list(zip(sps, spj, strict=True))
    front = [
        i
        for i, (x, y) in enumerate(points)
        if not any(a >= x and b >= y and (a, b) != (x, y) for a, b in points)
    ]
    ax.scatter(sps, spj, color="lightgray", label="trials")
    front.sort(key=lambda i: sps[i])
    ax.plot(
        [sps[i] for i in front], [spj[i] for i in front], "o-", color="C0", label="Pareto front"
    )
    mark(ax, sps, spj)
    ax.set(xlabel="trained steps per second", ylabel="trained steps per joule", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "pareto.png")

    try:
        with warnings.catch_warnings():  # its note that it ranks for low targets: hence minus
            warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
            importance = optuna.importance.get_param_importances(
                study,
                evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                target=lambda t: -score(t, "steps_per_joule"),
            )
    except (RuntimeError, ValueError) as exc:  # too few trials or one value per knob
        logger.warning("knob importance not plotted: %s", exc)
    else:
        if importance:
            fig, ax = plt.subplots(figsize=(7, 0.5 * len(importance) + 1.5))
            names = list(importance)[::-1]
            ax.barh(names, [importance[n] for n in names], color="C2")
            ax.set(xlabel="importance for high steps/J (Optuna PED-ANOVA)", title=title)
            save(fig, "importance.png")
    return paths
