"""The figures and the table of ``python -m bench goodput`` (``bench/suites/goodput.py``): per
run the joules, seconds and steps to the target and to the reference return, the samples weighed
by the goodput objective's efficiency, and per seed the steps/J run's joules over goodput's."""

from __future__ import annotations

from runtime.telemetry import RETURN_WINDOW

ARMS = {"steps-per-joule": "steps_per_joule", "goodput": "goodput_per_joule"}
"""File stem of each tuning (as ``bench.figure_goodput`` reads them) -> its objective."""


def summary(doc: dict, progress: list[dict], reference: float | None) -> dict:
    """A run's figures from its result document and progress lines."""
    first = next(
        (
            r
            for r in progress
            if reference is not None
            and r.get("return") is not None
            and r.get("episodes", 0) >= RETURN_WINDOW  # a mean of as many as the target's
            and r["return"] >= reference
        ),
        None,
    )
    target = doc.get("target") or {}
    passed = target.get("reached") and reference is not None and target.get("return") is not None
    if passed and reference <= target["return"]:
        # the mean passed the reference by the time it reached the target, between two
        # progress lines (a second apart) where both came within one
        at = {"joules": target["joules"], "steps": target["steps"]}
        if first is None or (first.get("joules") or 0.0) > at["joules"]:
            first = at
    return {
        "target": doc.get("target"),
        "spent_joules": spent_joules(doc),
        "trained_steps": doc["env_steps"],
        "wall_s": doc["wall_s"],
        "steps_per_joule": doc.get("steps_per_joule"),
        "lost_steps": doc["lost_steps"],
        "env_backend": (doc.get("config") or {}).get("env_backend"),  # what `auto` resolved to
        "learning_rate": {  # the schedule, and where it ended (the adaptive one moves it)
            k: (doc.get("learning_rate") or {}).get(k) for k in ("schedule", "last", "last_kl")
        },
        "policy_lag_mean": (doc.get("policy_lag") or {}).get("mean"),
        "probes_cached": bool((((doc.get("sizing") or {}).get("probes")) or {}).get("cached")),
        "reference": None
        if first is None
        else {
            "return": reference,
            "joules": first.get("joules"),
            "steps": first["steps"],
            "efficient_samples": efficient_samples(doc, progress, first["steps"]),
        },
        "efficient_samples": efficient_samples(doc, progress, target["steps"])
        if target.get("reached") and target.get("steps") is not None
        else None,
    }


def spent_joules(doc: dict) -> float | None:
    """The joules a run spent in all, from its process's start (the sizing's probes, and the
    runs it went on from, counted as a reached target counts them): its target's ``spent``,
    or, in a document from before that was kept, its energy window plus the sizing's."""
    target = doc.get("target") or {}
    if (target.get("spent") or {}).get("joules") is not None:
        return float(target["spent"]["joules"])
    energy = doc.get("energy") or {}
    if "gpu_j" not in energy or target.get("earlier_runs"):
        return None  # not known how much came before
    sizing = (target.get("sizing") or {}).get("joules") or 0.0
    return float(energy["gpu_j"]) + float(energy.get("cpu_j") or 0.0) + float(sizing)


def batches_in_use(doc: dict) -> list[tuple[float, int]]:
    """A run's batch size over time, as its tuner applied it: ``(unix time, batch)`` from its
    start (the sized or given batch) through each change in ``changes`` (left out where the
    document has no ``timeline`` to place them); empty where it does not say its first batch."""
    start = (doc.get("timeline") or {}).get("started_unix")
    first = ((doc.get("sizing") or {}).get("values") or {}).get("batch_size")
    first = first or ((doc.get("tuning") or {}).get("default") or {}).get("batch_size")
    first = first or (doc.get("config") or {}).get("batch_size")
    if not first:
        return []
    out = [(float("-inf"), int(first))]
    changes = (doc.get("changes") or []) if start is not None else []  # times from the start
    for change in changes:
        if "batch_size" in (change.get("changed") or {}):
            out.append((start + change["t"], int(change["changed"]["batch_size"])))
    return out


def efficient_samples(doc: dict, progress: list[dict], upto: int) -> float | None:
    """The trained steps up to ``upto``, each weighed by the efficiency of the batch in use at
    the noise scale its progress line reported (``policies.noise_scale.efficiency``, what the
    goodput objective counts): McCandlish et al.'s ``E_min``, the samples a tiny batch would
    have needed for the same progress if the model holds. Steps before a run's first estimate
    count at it, steps after its last at that one (a target is reached between two lines).
    None where no line has an estimate, or the document does not say the run's first batch."""
    from policies.noise_scale import efficiency

    batches, total, counted, last = batches_in_use(doc), 0.0, 0, None
    for row in progress:
        noise = row.get("noise_scale")
        if noise is None or not batches:
            continue
        batch = next(b for t, b in reversed(batches) if row["t"] >= t)
        last = efficiency(noise, batch) or 0.0
        steps = min(row["steps"], upto)
        total += (steps - counted) * last
        counted = max(counted, steps)
        if steps >= upto:
            break
    if last is None:
        return None
    return total + max(upto - counted, 0) * last  # past the last line, at its estimate


def table(results: dict, seeds: list[int], arms: list[str], reference: float | None) -> str:
    """The markdown table of the runs, and per seed the steps/J run's joules over goodput's."""
    head = "| tuned by | seed | to the target: joules | seconds | trained steps | steps/J |"
    rows = [head + (f" return {reference:g} reached at |" if reference is not None else "")]
    rows.append("|---|---:|---:|---:|---:|---:|" + ("---:|" if reference is not None else ""))
    joules: dict[tuple[str, int], float] = {}
    for seed in seeds:
        for arm in arms:
            r = results.get(f"{arm}-seed{seed}") or {}
            if r.get("failed") or not r:
                rows.append(f"| {arm} | {seed} | failed | | | |")
                continue
            t = r["target"] or {}
            if t.get("reached"):
                joules[(arm, seed)] = t["joules"]
                sizing = t.get("sizing")  # its probes' share, where the run was sized
                of = f" ({sizing['joules'] / 1000:.1f} kJ sizing)" if sizing else ""
                to = f"**{t['joules'] / 1000:.1f} kJ**{of} | {t['seconds']:.1f} | {t['steps']:,}"
            else:
                best = t.get("best_return")  # None before a 100-episode mean
                to = f"not reached (best {'n/a' if best is None else f'{best:.0f}'}) | | "
                to += f"{r['trained_steps']:,}"
            ref = r.get("reference")
            tail = "" if reference is None else " not reached |"
            if ref:
                kj = "n/a" if ref["joules"] is None else f"{ref['joules'] / 1000:.1f} kJ"
                tail = f" {kj}, {ref['steps'] / 1e6:.2f}M steps |"
            rows.append(f"| {arm} | {seed} | {to} | {r['steps_per_joule'] or 0:.1f} |{tail}")
    ran = [r for r in results.values() if r and not r.get("failed")]
    backends = sorted({str(r.get("env_backend")) for r in ran})
    rows.append(f"\nThe actors' env backend: {', '.join(backends) or 'n/a'}.")
    rows.append(_learning_rates(ran))
    rows.append(_efficient(results, arms, reference))
    if set(arms) != set(ARMS):
        return "\n".join(rows) + "\n"
    note = ", ".join(_ratios(results, seeds, joules)) or "n/a (no seed gives a ratio or a bound)"
    return "\n".join(rows) + f"\n\nsteps/J-tuned joules over goodput-tuned, per seed: {note}\n"


def _ratios(results: dict, seeds: list[int], joules: dict[tuple[str, int], float]) -> list[str]:
    """Per seed, the steps/J run's joules to the target over the goodput run's; where one of
    the two stopped short of the target, a bound from what it spent in all (a run that missed
    would have needed more than it spent)."""
    out = []
    for s in seeds:
        sj, gp = joules.get(("steps-per-joule", s)), joules.get(("goodput", s))
        if sj is not None and gp is not None:
            out.append(f"{sj / gp:.2f}x (seed {s})")
            continue
        missed = results.get(f"{'steps-per-joule' if sj is None else 'goodput'}-seed{s}") or {}
        spent = None if (sj is None) == (gp is None) else missed.get("spent_joules")
        if spent is None:
            continue  # both missed it, or the one that missed failed or did not say
        if sj is None:  # it would have needed more than it spent
            out.append(f"more than {spent / gp:.2f}x (seed {s}: steps/J missed it)")
        else:
            out.append(f"less than {sj / spent:.2f}x (seed {s}: goodput missed it)")
    return out


def _efficient(results: dict, arms: list[str], reference: float | None) -> str:
    """A line giving each tuning's range of ``efficient_samples`` to the target and to the
    reference return: where the goodput objective's model holds, equal across tunings."""

    def span(arm: str, key: str | None) -> str:
        runs = [r for k, r in results.items() if k.startswith(f"{arm}-seed") and r]
        got = [(r.get(key) or {}) if key else r for r in runs if not r.get("failed")]
        vals = [g["efficient_samples"] for g in got if g.get("efficient_samples") is not None]
        return f"{arm} {min(vals) / 1e6:.2f}-{max(vals) / 1e6:.2f}M" if vals else f"{arm} n/a"

    to = [("the target", None)] + ([(f"{reference:g}", "reference")] if reference else [])
    parts = [f"to {name}: " + ", ".join(span(arm, key) for arm in arms) for name, key in to]
    what = "what the goodput objective counts; equal across tunings where its model holds"
    return f"Samples weighed by the efficiency of the batch in use ({what}): {'; '.join(parts)}."


def _learning_rates(ran: list[dict]) -> str:
    """A line naming the runs' learning-rate schedules and the range of their last rates."""
    rates = [r.get("learning_rate") or {} for r in ran]
    schedules = sorted({str(lr.get("schedule")) for lr in rates if lr.get("schedule")})
    last = [lr["last"] for lr in rates if isinstance(lr.get("last"), int | float)]
    span = f" (the last rates {min(last):.2g} to {max(last):.2g})" if last else ""
    return f"The learning-rate schedule: {', '.join(schedules) or 'n/a'}{span}."


def against_sb3(results: dict, sb3: dict | None, sb3_steps: float, reference: float | None) -> str:
    """Lines setting SB3 PPO's joules for ``sb3_steps`` on this host (its arm document, from
    its window's steps/J) against each run's joules to ``reference``; empty without the arm."""
    if sb3 is None or reference is None:
        return ""
    spj = sb3.get("steps_per_joule")
    if sb3.get("failed") or not spj:
        return f"\nSB3 PPO on this host: failed ({sb3.get('error') or sb3.get('returncode')}).\n"
    joules = sb3_steps / spj
    lines = [
        f"\nSB3 PPO on this host (one env per core, the update on the CPU): "
        f"{sb3['steps_per_s']:,.0f} steps/s at {spj:.2f} steps/J over its "
        f"{sb3.get('window_s', 0):.0f}-s window (its start-up left out; each run's joules hold "
        f"its own, and its probes where it took them), so {sb3_steps / 1e6:g}M steps cost "
        f"{joules / 1000:.1f} kJ. Its joules over each run's to {reference:g}:"
    ]
    for name, r in results.items():
        ref = (r or {}).get("reference") or {}
        if (r or {}).get("failed"):
            lines.append(f"- {name}: failed")
        elif ref.get("joules"):
            lines.append(f"- {name}: {joules / ref['joules']:.2f}x ({ref['joules'] / 1000:.1f} kJ)")
        else:
            lines.append(f"- {name}: {'n/a (no joules)' if ref else 'not reached'}")
    return "\n".join(lines) + "\n"


def probes_note(results: dict, mode: str) -> str:
    """A line saying the probe cache (``--probe-cache``) and which runs read their probes from
    it, as each run's document says (a retried or resumed run may have found them there)."""
    read = [k for k, r in results.items() if r and not r.get("failed") and r.get("probes_cached")]
    how = (
        "each run a probe cache of its own"
        if mode == "own"
        else "one probe cache for the runs, the first of a workload probing it"
    )
    return f"\nProbes: {how}; read from the cache by {', '.join(read) or 'no run'}.\n"
