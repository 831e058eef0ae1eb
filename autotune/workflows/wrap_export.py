"""``autotune export`` of a wrapped script's study (``autotune wrap``, or ``autotune study --
CMD``): the script's best knob values.

From the completed trials, grouped by config (every knob's value):

* **recommended**: the config with the best median figure (steps/J, or steps/s with
  ``pick="steps_per_s"``), as the knob values, the command line with its ``{name}``
  placeholders filled in, and the environment variables the script reads them from
  (``AUTOTUNE_KNOBS``, ``AUTOTUNE_<NAME>``): what runs it again without autotune;
* **evidence**: trial counts, and the recommendation's measured figures (median, range, trial
  numbers) beside the script's own defaults' (trial one), with their ratio.

A study's trials are picked by their figures scaled by its reference runs, where it has them
(``autotune study --reference-every``: ``autotune.tuning.reference``), else by the raw ones;
a study of both objectives (``both``) picks by steps per joule.

A script that reports no steps is scored per run: its figures are runs per joule and runs per
second, and the document says so (``unit``: ``runs``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from autotune.tuning.reference import scaled_name
from autotune.tuning.storage import config_key
from autotune.workflows.export import FORMAT_VERSION, ExportError, by_config, default_key
from autotune.wrap.wrapper import knob_env, parse_knob, substitute

METRICS = ("steps_per_joule", "steps_per_s")


def is_wrap_study(study: Any) -> bool:
    """Whether ``study`` holds a wrapped script's runs (``autotune wrap`` or ``autotune study
    -- CMD``)."""
    return script_meta(study) is not None


def script_meta(study: Any) -> dict[str, Any] | None:
    """A wrapped script's study settings as ``autotune wrap`` records them (``mode``, ``cmd``,
    ``knobs``, ``objective``, ``trial_s``), from either kind of study (an ``autotune study``
    one adds ``made_by`` and its ``default`` values); None for another."""
    wrap = study.user_attrs.get("wrap")
    if isinstance(wrap, dict):
        return wrap
    meta = study.user_attrs.get("autotune")
    if not isinstance(meta, dict) or meta.get("kind") != "script":
        return None
    objective = meta.get("objective", "steps_per_joule")
    return {
        "mode": "restart",
        "cmd": meta.get("cmd", []),
        "knobs": meta.get("knobs"),
        "objective": "steps_per_joule" if objective == "both" else objective,
        "trial_s": meta.get("trial_s"),
        "made_by": "autotune study -- CMD",
        "default": meta.get("default") or {},
    }


def pick_figure(trial: Any, metric: str) -> float | None:
    """The figure a trial is picked by: scaled by the study's references, else raw."""
    scaled = trial.user_attrs.get(scaled_name(metric))
    return scaled if scaled is not None else trial_figures(trial)[metric]


def trial_figures(trial: Any) -> dict[str, float | None]:
    """A completed wrap trial's steps (or runs) per joule and per second, and its watts: as
    the trial recorded them, else from its steps, joules and seconds (studies made before the
    figures were recorded)."""
    attrs = trial.user_attrs
    wall = attrs.get("wall_s") or 0.0
    if attrs.get("steps_per_joule") is not None:
        figures = {k: attrs.get(k) for k in (*METRICS, "gpu_w", "cpu_w")}
        for watts, joules in (("gpu_w", "gpu_j"), ("cpu_w", "cpu_j")):  # a study's trials
            if figures[watts] is None and attrs.get(joules) is not None and wall > 0:
                figures[watts] = attrs[joules] / wall
        return figures
    amount = float(attrs.get("steps") or 1)
    joules = (attrs.get("gpu_j") or 0.0) + (attrs.get("cpu_j") or 0.0)
    return {
        "steps_per_joule": amount / joules if joules > 0 else None,
        "steps_per_s": amount / wall if wall > 0 else None,
        "gpu_w": (attrs.get("gpu_j") or 0.0) / wall if wall > 0 else None,
        "cpu_w": (attrs.get("cpu_j") or 0.0) / wall if wall > 0 else None,
    }


def study_unit(meta: dict[str, Any], done: list[Any]) -> str:
    """``steps`` where the script reported steps (live mode always measures them), else
    ``runs``."""
    if meta.get("mode") == "live" or any(t.user_attrs.get("steps") for t in done):
        return "steps"
    return "runs"


def trial_command(trial: Any, latest: list[str]) -> list[str]:
    """The command a wrap trial ran: as it recorded it, else the study's (``latest``: trials
    recorded no command before a study could be resumed with another)."""
    ran = trial.user_attrs.get("cmd")
    if isinstance(ran, list) and all(isinstance(a, str) for a in ran):
        return list(ran)
    return latest


def single_valued(meta: dict[str, Any]) -> dict[str, Any]:
    """The wrap study's knobs that have one value, with it."""
    space = [parse_knob(k) for k in meta.get("knobs") or []]
    return {k.name: k.choices[0] for k in space if len(k.choices) == 1}


def trial_config(trial: Any, fixed: dict[str, Any]) -> dict[str, Any]:
    """Every knob's value in a trial: the values it ran with, else its parameters and the
    single-valued knobs."""
    values = trial.user_attrs.get("values")
    return dict(values) if isinstance(values, dict) else {**fixed, **trial.params}


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _measured(trials: list[Any]) -> dict[str, Any]:
    figs = [trial_figures(t) for t in trials]
    out: dict[str, Any] = {"trials": [t.number for t in trials]}
    for metric in METRICS:
        out[metric] = _stats([f[metric] for f in figs if f[metric] is not None])
    for watts in ("gpu_w", "cpu_w"):
        out[watts] = _stats([f[watts] for f in figs if f[watts] is not None])["median"]
    return out


def wrap_export_doc(study: Any, pick: str | None = None) -> dict[str, Any]:
    """The export document of a wrap study (see the module docstring).

    Raises:
        ExportError: not a wrap study, an unknown ``pick``, or no completed trial.
    """
    meta = script_meta(study)
    if meta is None:
        raise ExportError(
            f"study {study.study_name!r} is neither an 'autotune wrap' study nor an "
            "'autotune study -- CMD' one"
        )
    metric = pick or meta.get("objective", "steps_per_joule")
    if metric not in METRICS:
        raise ExportError(
            f"pick={pick!r}: allowed for a wrapped script's study {', '.join(METRICS)}"
        )
    fixed = single_valued(meta)
    made_by = meta.get("made_by", "autotune wrap")
    latest = list(meta.get("cmd", []))

    def run_of(t: Any) -> dict[str, Any]:  # a config as one command ran it: never pooled
        return {"cmd": trial_command(t, latest), "values": trial_config(t, fixed)}

    trials, done, groups = by_config(study, run_of, made_by)

    def median(ts: list[Any]) -> float:
        return statistics.median(pick_figure(t, metric) or 0.0 for t in ts)

    best = max(groups.values(), key=lambda ts: (median(ts), len(ts)))
    values, cmd = trial_config(best[0], fixed), trial_command(best[0], latest)
    defaults = study.user_attrs.get("wrap_defaults")
    if "made_by" in meta:  # autotune study: its default trial ran the knobs' first values
        dkey = default_key(done, lambda t: trial_config(t, fixed), {**fixed, **meta["default"]})
        defaults = json.loads(dkey)
    ran = {"cmd": cmd, "values": defaults}  # the defaults as the recommended command ran them
    default = groups.get(config_key(ran), []) if isinstance(defaults, dict) else []
    ratio = median(best) / median(default) if default and median(default) else None
    unit = study_unit(meta, done)
    commands = sorted({json.dumps(trial_command(t, latest)) for t in done})
    workload = {"command": cmd, "mode": meta.get("mode"), "knobs": meta.get("knobs")}
    if len(commands) > 1:  # a study resumed with another command: said, not pooled
        workload["commands"] = [json.loads(c) for c in commands]
        workload["note"] = (
            f"the study's completed trials ran {len(commands)} commands (resumed with "
            "another one); each config's figures are those of one command, and the "
            "recommended command is the one the best config's trials ran"
        )
    return {
        "autotune_export": FORMAT_VERSION,
        "kind": "wrap",
        "study": study.study_name,
        "workload": {**workload, "made_by": made_by},
        "picked_by": metric,
        "unit": unit,
        "recommended": {
            "values": values,
            "command": substitute(cmd, values),
            "environment": knob_env(values),
        },
        "evidence": {
            "trial_s": meta.get("trial_s"),
            "trials": {
                "complete": len(done),
                "failed": sum(t.state == TrialState.FAIL for t in trials),
                "configs": len(groups),
            },
            "recommended": _measured(best),
            "default": {"values": defaults, **_measured(default)},
            f"{metric}_vs_default": ratio,
            "note": (
                f"medians of the study's runs, in {unit} per joule and per second"
                + (
                    " (the script reported no steps: one run counts as one)"
                    if unit == "runs"
                    else " (steps the script reported through autotune.client)"
                )
                + "; run the recommended command to re-measure"
                + (
                    "; the study did not record its knobs: knobs with one value are not in "
                    "the values"
                    if meta.get("knobs") is None and not any("values" in t.user_attrs for t in done)
                    else ""
                )
            ),
        },
    }


def write_wrap_plots(study: Any, out_dir: Path, recommended: dict[str, Any]) -> list[Path]:
    """Plots of a wrap study's completed trials: the figure per trial in order, and per knob
    (the recommended config circled); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    meta = script_meta(study) or {}
    space = [k.partition("=")[0] for k in meta.get("knobs") or []]
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    unit = study_unit(meta, done)
    per_j = [pick_figure(t, "steps_per_joule") or 0.0 for t in done]
    fixed = single_valued(meta)
    configs = [trial_config(t, fixed) for t in done]
    rec = [config_key(c) == config_key(recommended) for c in configs]
    title = f"wrap study {study.study_name}: {len(done)} trials"
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        paths.append(out_dir / name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    numbers = [t.number for t in done]
    ax.plot(numbers, per_j, "o-", color="C0", label="trials")
    ax.scatter(
        [n for n, r in zip(numbers, rec, strict=True) if r],
        [y for y, r in zip(per_j, rec, strict=True) if r],
        s=160,
        facecolors="none",
        edgecolors="red",
        label="recommended",
    )
    ax.set(xlabel="trial", ylabel=f"{unit} per joule", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "per_joule_by_trial.png")
    for name in space:
        xs = [str(c.get(name)) for c in configs]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.scatter(xs, per_j, color="C1")
        ax.set(xlabel=name, ylabel=f"{unit} per joule", title=title)
        ax.grid(alpha=0.3)
        save(fig, f"per_joule_vs_{name}.png")
    return paths
