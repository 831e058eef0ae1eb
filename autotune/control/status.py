"""``autotune status``: what is being tuned, how it runs now, the best so far and every trial.

The daemon builds the document (``Daemon.status``); with no daemon running, the same trial
history is read straight from a study's storage. ``autotune.cli.status_view`` draws either.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import optuna

from autotune.tuning.counters import Counters
from autotune.tuning.storage import StudyError, check_readable, redact, storage_url

logger = logging.getLogger(__name__)


def live_rates(readings: list[Counters], span_s: float) -> dict[str, Any] | None:
    """Trained steps/s, GPU and CPU watts and steps per joule over the last ``span_s`` of a
    job's reports (None until two reports span some time)."""
    if len(readings) < 2:
        return None
    last = readings[-1]
    first = next((r for r in readings if last.t_s - r.t_s <= span_s), readings[0])
    dt = last.t_s - first.t_s
    if dt <= 0:
        return None
    steps = last.trained_steps - first.trained_steps
    gpu_j, cpu_j = last.gpu_j - first.gpu_j, last.cpu_j - first.cpu_j
    rates = {
        "span_s": dt,
        "steps_per_s": steps / dt,
        "gpu_w": gpu_j / dt,
        "cpu_w": cpu_j / dt,
        "steps_per_joule": steps / (gpu_j + cpu_j) if gpu_j + cpu_j > 0 else None,
    }
    if not all(v is None or math.isfinite(v) for v in rates.values()):
        return None  # a span too short to divide by: no figures, not infinite ones
    return {**rates, "cpu_source": last.cpu_source}


LIVE_FRESH_S = 30.0
"""``autotune status`` shows a wrap's live figures (``autotune.wrap.progress``) while they are
younger than this."""


def fresh_live(study: Any) -> dict[str, Any] | None:
    """The study's ``wrap_live`` figures while a wrap is writing them, else None."""
    live = study.user_attrs.get("wrap_live")
    if isinstance(live, dict) and time.time() - float(live.get("unix", 0)) < LIVE_FRESH_S:
        return live
    return None


def _note(t: Any) -> str:
    attrs = t.user_attrs
    if "error" in attrs:
        return f"refused: {attrs['error']}"
    if "unmetered" in attrs:
        return f"{attrs['unmetered']} (tried once more)"
    if t.state.name == "FAIL":
        return attrs.get("skipped") or attrs.get("interrupted", "tuner restarted")
    if t.state.name == "PRUNED":
        return "pruned (past envs_per_actor saturation)"
    if attrs.get("feasible") is False:
        return "infeasible (constraint)"
    return ""


def study_summary(study: Any, best: dict[str, Any] | None = None) -> dict[str, Any]:
    """The best config (the tuner's median-based one if given, else the study's best trial)
    and one row per trial."""
    trials = study.get_trials(deepcopy=False)
    rows = [
        {
            "number": t.number,
            "state": t.state.name,
            "values": {**t.params, **(t.user_attrs.get("given") or {})},  # run as given too
            "objective": t.value,
            "steps_per_s": t.user_attrs.get("steps_per_s"),
            "steps_per_joule": t.user_attrs.get("steps_per_joule"),
            "gpu_j": t.user_attrs.get("gpu_j"),
            "cpu_j": t.user_attrs.get("cpu_j"),
            "noise_scale": t.user_attrs.get("noise_scale"),
            "return_before": t.user_attrs.get("return_before"),  # the learning curve, around
            "return_after": t.user_attrs.get("return_after"),  # the trial's change
            "note": _note(t),
        }
        for t in trials
    ]
    if best is None:
        done = [r for r in rows if r["state"] == "COMPLETE" and "infeasible" not in r["note"]]
        if done:
            top = max(done, key=lambda r: r["objective"])
            best = {"values": top["values"], "objective": top["objective"], "measurements": 1}
    return {"best": best, "trials": rows}


def stored_status(storage: str, study_name: str) -> dict[str, Any]:
    """The status document of a study read from its storage (no daemon); live figures only
    where an ``autotune wrap`` is writing them (``autotune.wrap.progress``).

    Raises:
        autotune.tuning.storage.StudyError: if the storage cannot be opened or holds no such study.
    """
    check_readable(storage)
    storage = storage_url(storage)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except Exception as exc:  # SQLAlchemy and Optuna raise many kinds; all mean "cannot read"
        raise StudyError(
            f"cannot read study {study_name!r} from {redact(storage)!r}: "
            f"{redact(f'{type(exc).__name__}: {exc}')}"
        ) from None
    summary = study_summary(study)
    noise = [r["noise_scale"] for r in summary["trials"] if r["noise_scale"] is not None]
    return {
        "job": None,
        "storage": redact(storage),
        "study": study_name,
        "live": fresh_live(study),
        "noise_scale": noise[-1] if noise else None,  # as the latest trial measured it
        **summary,
    }


NODES_MAX = 4096
_NODE_FIELDS = {
    "node": str,
    "ip": str,
    "cpus": int,
    "actors": int,
    "stepped": int,
    "lost": bool,
}


def valid_nodes(nodes: Any) -> list[dict[str, Any]] | None:
    """A job's reported cluster nodes, checked field by field (they come off a socket).

    Raises:
        ValueError: saying what is wrong and what is allowed.
    """
    if nodes is None:
        return None
    if not isinstance(nodes, list) or len(nodes) > NODES_MAX:
        raise ValueError(f"'nodes': allowed a list of at most {NODES_MAX} nodes, or none")
    out = []
    for n in nodes:
        if not isinstance(n, dict) or set(n) != set(_NODE_FIELDS):
            raise ValueError(f"'nodes': each node has exactly {sorted(_NODE_FIELDS)}")
        for key, kind in _NODE_FIELDS.items():
            value = n[key]
            ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok or (kind is str and len(value) > 64) or (kind is int and value < 0):
                raise ValueError(f"'nodes': {key}={value!r} is not a {kind.__name__} as allowed")
        out.append(dict(n))
    return out


def daemon_status(daemon: Any, span_s: float) -> dict[str, Any]:
    """What ``autotune status`` shows of a daemon (``Daemon.status``): the daemon, the
    machine's share-out and, per job, ``session_status`` with its allocation. A job whose study
    cannot be read shows with its allocation and the error; the other jobs show whole."""
    jobs = []
    for s in daemon.sessions.values():
        try:
            doc = session_status(s, span_s)
        except Exception as exc:  # its storage: down, or damaged
            logger.warning("status of job %s: %s", s.job_id, exc)
            hello = s.hello
            doc = {"id": s.job_id, "job": s.job_id, "pid": hello.get("pid"), "env": hello["env"]}
            doc.update(study=hello["study"], error=f"{type(exc).__name__}: {exc}"[:500])
        jobs.append({**doc, **daemon.shares.job_status(s.job_id)})
    return {
        "pid": os.getpid(),
        "endpoint": daemon.endpoint,
        "uptime_s": time.time() - daemon.started,
        **daemon.shares.status(),
        "jobs": jobs,
    }


def session_status(s: Any, span_s: float) -> dict[str, Any]:
    """One registered job as ``autotune status`` shows it (a daemon's ``Session``): its study,
    phase and trial, config, live rates over ``span_s``, knobs, best and trial history."""
    from autotune.tuning.knobs import knobs_to_wire

    cur = s.tuner.current
    live = live_rates(list(s.recent), span_s)
    return {
        "id": s.job_id,
        "job": s.job_id,
        "pid": s.hello.get("pid"),
        "env": s.hello.get("env"),
        "storage": redact(s.hello["storage"]),
        "study": s.hello["study"],
        "objective": s.tuner.settings.objective,
        "unmet": s.tuner.unmet,
        "phase": cur.phase if cur else ("hold" if s.tuner.holding else "idle"),
        "trial": cur.trial.number if cur and cur.trial is not None else None,
        "config": s.config,
        "nodes": s.remote.nodes,
        "noise_scale": s.remote.noise_scale,
        "live": live,
        "steps_per_s": live["steps_per_s"] if live else None,
        "steps_per_joule": live["steps_per_joule"] if live else None,
        "knobs": knobs_to_wire(s.space),
        "tuned": [k.name for k in s.tuner.knobs],
        **study_summary(s.tuner.study, s.tuner.best()),
    }
