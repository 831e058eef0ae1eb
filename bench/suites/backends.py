"""Env backends side by side: the raw-stepping limit and ``autotune train`` on each backend
(gymnasium, EnvPool), per env, one after the other on one machine.

    python -m bench backends --envs Ant-v5,HalfCheetah-v5,Humanoid-v5,Hopper-v5 \\
        --raw-s 15 --train-s 60 --markdown out/backends/table.md --out out/backends

Steps, per env: ``raw-<env>-<backend>`` (``bench/raw_env_rate.py``: every core, 16 envs per
process, random actions), ``probe-<env>-<backend>`` (the sizing probe's loaded actor rounds,
``runtime.env_probes.probe_rounds_loaded``: an actor of 16 envs and the run's policy on every
core at once, as steps/s of all of them by the wall clock; the CPU seconds beside) and
``train-<env>-<backend>`` (``autotune train --env-backend <backend>`` with ``auto`` sizing,
``--max-wall-s --train-s``, start-up included) and ``states-<env>-<backend>`` (below);
``again-<env>-<backend>`` (raw stepping once more, after the env's other steps: the host's
speed drifts, so the raw rate is then the mean of before and after, both shown);
``--parts`` picks which. A train step's figures: its whole run (trained steps over the process's
wall time) and its window (from ``--warmup-s`` after its first trained step to its last progress
line), with the config its sizing chose. The limit of an env is the faster backend's raw rate.
EnvPool steps are left out, saying so, where EnvPool is not installed or lacks the env.

A MuJoCo step costs more in some states than others: a learning policy that keeps Humanoid-v5
upright for longer steps it at up to 1.5x random actions' cost per step (which mostly fall
within 25 steps). A ``states`` step measures that on every core, at the train run's env count:
raw random-action stepping, and the actor's own collect loop acting with the policy a train
step of the env ended with (its checkpoint: EnvPool's run where there is one, so both backends
step the same policy's states; ``bench.actor_loop_rate``), each with its mean episode length.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from bench.suite import Step, print_table
from bench.train_run import add_train_steps_arg, check_train_steps

NAME = "backends"
HELP = "the raw-stepping limit and autotune train on each env backend (gymnasium, EnvPool)"
BACKENDS = ("gymnasium", "envpool", "auto")
"""``auto``: train steps only, each run's sizing choosing (``--env-backend auto``)."""
PARTS = ("raw", "probe", "train", "states", "again")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--envs", default="Ant-v5,HalfCheetah-v5,Humanoid-v5,Hopper-v5")
    ap.add_argument("--backends", default="gymnasium,envpool", help="of gymnasium, envpool, auto")
    ap.add_argument("--policy", default="auto:256:128:64:auto", help="every train step's MLP")
    ap.add_argument("--raw-s", type=float, default=15.0, help="seconds of raw stepping")
    ap.add_argument("--train-s", type=float, default=60.0, help="wall budget of a train step")
    add_train_steps_arg(ap)
    ap.add_argument("--warmup-s", type=float, default=10.0, help="left out of a train window")
    ap.add_argument("--processes", type=int, default=0, help="raw: processes (0: every core)")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="the table, as markdown")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)}")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    a.env_list = [e.strip() for e in a.envs.split(",") if e.strip()]
    if not a.env_list:
        ap.error("--envs: give at least one env id")
    a.backend_list = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in a.backend_list if b not in BACKENDS]
    if bad or not a.backend_list:
        ap.error(f"--backends: unknown {bad or 'nothing given'}; allowed {', '.join(BACKENDS)}")
    a.part_list = [p.strip() for p in a.parts.split(",") if p.strip()]
    bad = [p for p in a.part_list if p not in PARTS]
    if bad or not a.part_list:
        ap.error(f"--parts: unknown {bad or 'nothing given'}; allowed {', '.join(PARTS)}")
    if not (a.raw_s > 0 and a.train_s > 0 and a.warmup_s >= 0 and a.processes >= 0):
        ap.error("--raw-s and --train-s must be > 0, --warmup-s and --processes >= 0")
    check_train_steps(ap, a)


def _has(env: str, backend: str) -> str | None:
    """Why ``backend`` cannot step ``env`` here, or None."""
    if backend in ("gymnasium", "auto"):
        return None
    from runtime.env_backends import envpool_ids

    ids = envpool_ids()
    return None if env in ids else ("EnvPool is not installed" if not ids else "not in EnvPool")


def _chosen_per_run(backend: str) -> str | None:
    return "auto: each run's sizing chooses" if backend == "auto" else None


def raw(a: argparse.Namespace, env: str, backend: str) -> dict:
    from bench.raw_env_rate import raw_step_rate

    if why := _has(env, backend) or _chosen_per_run(backend):
        return {"skipped": why}
    procs = a.processes or os.cpu_count() or 1
    rate = raw_step_rate(env, procs, 16, a.raw_s, None, backend)
    return {"processes": procs, "envs_per_process": 16, "steps_per_s": rate}


def _raw_rate(results: dict, env: str, backend: str) -> tuple[float | None, str]:
    """``backend``'s raw rate of ``env``: the mean of before and after where raw stepping ran
    again, and its cell (both figures, or the skip's reason)."""
    runs = [results.get(f"{p}-{env}-{backend}", {}) for p in ("raw", "again")]
    rates = [r["steps_per_s"] for r in runs if "steps_per_s" in r]
    if not rates:
        return None, next((r["skipped"] for r in runs if "skipped" in r), "")
    cell = " / ".join(_fmt(x) for x in rates)
    return sum(rates) / len(rates), cell


def probe(a: argparse.Namespace, env: str, backend: str) -> dict:
    from policies.mlp import parse_spec
    from runtime.env_probes import ROUND_ENVS, probe_rounds_loaded
    from runtime.envs import probe_env

    if why := _has(env, backend) or _chosen_per_run(backend):
        return {"skipped": why}
    procs = a.processes or os.cpu_count() or 1
    info = probe_env(env, backend)
    sizes = parse_spec(a.policy, info.obs_dim, info.act_dim)
    rounds = probe_rounds_loaded(env, procs, sizes, info.discrete, backend=backend)
    k = max(ROUND_ENVS)
    return {
        "processes": procs,
        "round_s": rounds,  # by clock (cpu, wall), by env count
        "steps_per_s": procs * k / rounds["wall"][k],
        "steps_per_cpu_s": k / rounds["cpu"][k],
    }


def train(a: argparse.Namespace, env: str, backend: str) -> dict:
    from bench.train_run import train_run

    if why := _has(env, backend):
        return {"skipped": why}
    stem = Path(a.out) / "runs" / f"{env}-{backend}"
    flags = ["--env", env, "--env-backend", backend, "--policy", a.policy]
    if "states" in a.part_list:  # its policy at the end, for the states step
        checkpoint = Path(f"{stem}.checkpoint")
        shutil.rmtree(checkpoint, ignore_errors=True)  # a run would go on from one left there
        flags += ["--checkpoint", str(checkpoint)]
    return train_run(stem, flags, a.train_s, a.warmup_s, a.train_steps)


def _trained_policy(a: argparse.Namespace, env: str) -> tuple[str, str, int] | None:
    """The train step of ``env`` whose final policy a states step acts with: its name, its
    learner state file and its envs per actor (EnvPool's run first)."""
    for backend in ("envpool", "gymnasium", "auto"):
        stem = Path(a.out) / "runs" / f"{env}-{backend}"
        state = Path(f"{stem}.checkpoint") / "learner.pt"
        if state.exists() and Path(f"{stem}.json").exists():
            doc = json.loads(Path(f"{stem}.json").read_text())
            return f"train-{env}-{backend}", str(state), int(doc["config"]["envs_per_actor"])
    return None


def states(a: argparse.Namespace, env: str, backend: str) -> dict:
    from bench.actor_loop_rate import run_loop

    if why := _has(env, backend) or _chosen_per_run(backend):
        return {"skipped": why}
    if (trained := _trained_policy(a, env)) is None:
        return {"skipped": "no train step of this env left its policy (run the train part)"}
    name, state, k = trained
    procs = a.processes or os.cpu_count() or 1
    base = {"env": env, "backend": backend, "policy": a.policy, "envs_per_actor": k}
    base.update(actors=procs, seconds=a.raw_s)
    try:
        raw_loop = run_loop({**base, "loop": "raw"}, procs)
        collect = run_loop({**base, "loop": "collect", "weights": state}, procs)
    except SystemExit as exc:  # a loop's process failed: its traceback went to stderr
        return {"failed": True, "why": str(exc)}
    return {"policy_of": name, "envs_per_actor": k, "raw": raw_loop, "collect": collect}


def _fmt(x: float | None, digits: int = 0) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def _cell(t: dict) -> str:
    if "window_steps_per_s" not in t:
        return t.get("skipped", "failed" if t else "")
    c = t.get("config") or {}
    knobs = f"{c.get('actors')}x{c.get('envs_per_actor')}, b{c.get('batch_size')}"
    return (
        f"{_fmt(t['window_steps_per_s'])} ({_fmt(t['whole_steps_per_s'])}; {knobs}, "
        f"{c.get('trainer_device')})"
    )


def table(results: dict) -> str:
    rows = [
        "| env | raw gymnasium (before / after) | raw EnvPool | limit | loaded probe "
        "gymnasium | loaded probe EnvPool | train gymnasium: window (whole) | "
        "train EnvPool: window (whole) | EnvPool train / its raw | EnvPool / gymnasium train |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    envs = dict.fromkeys(k.split("-", 1)[1].rsplit("-", 1)[0] for k in results)
    for env in envs:
        (rg, cg), (re_, ce) = (_raw_rate(results, env, b) for b in ("gymnasium", "envpool"))
        tg, te = results.get(f"train-{env}-gymnasium", {}), results.get(f"train-{env}-envpool", {})
        limit = max([r for r in (rg, re_) if r is not None], default=None)
        own = (
            f"{te['window_steps_per_s'] / re_:.2f} ({te['whole_steps_per_s'] / re_:.2f})"
            if "window_steps_per_s" in te and re_ is not None
            else ""
        )
        gain = (
            f"{te['window_steps_per_s'] / tg['window_steps_per_s']:.2f} "
            f"({te['whole_steps_per_s'] / tg['whole_steps_per_s']:.2f})"
            if "window_steps_per_s" in te and "window_steps_per_s" in tg
            else ""
        )
        pg, pe = results.get(f"probe-{env}-gymnasium", {}), results.get(f"probe-{env}-envpool", {})
        probes = [_fmt(r.get("steps_per_s")) or r.get("skipped", "") for r in (pg, pe)]
        rows.append(
            f"| {env} | {cg} | {ce} | {_fmt(limit)} | {probes[0]} | "
            f"{probes[1]} | {_cell(tg)} | {_cell(te)} | {own} | {gain} |"
        )
    chose = [
        f"| {env} | {t.get('env_backend')} | {_cell(t)} |"
        for env in envs
        if "window_steps_per_s" in (t := results.get(f"train-{env}-auto", {}))
    ]
    if chose:
        rows += ["", "| env | auto: the backend sizing chose | window (whole) |", "|---|---|---:|"]
    return "\n".join(rows + chose + _states_rows(results, envs)) + "\n"


def _states_rows(results: dict, envs: dict) -> list[str]:
    rows = []
    for env in envs:
        for b in ("gymnasium", "envpool"):
            st = results.get(f"states-{env}-{b}", {})
            if "collect" not in st:
                continue
            raw_, col = st["raw"], st["collect"]
            trained = results.get(f"train-{env}-{b}", {}).get("window_steps_per_s")
            rows.append(
                f"| {env} | {b} | {st['policy_of']}, {st['envs_per_actor']} envs per actor | "
                f"{_fmt(raw_['steps_per_s'])} ({raw_['episode_len']}; "
                f"{raw_['cpu_ms_per_step'] * 1e3:.0f} us) | {_fmt(col['steps_per_s'])} "
                f"({col['episode_len']}; {col['cpu_ms_per_step'] * 1e3:.0f} us) | "
                + (f"{trained / raw_['steps_per_s']:.2f}, " if trained else ", ")
                + (f"{trained / col['steps_per_s']:.2f} |" if trained else " |")
            )
    if not rows:
        return []
    return [
        "",
        "| env | backend | states of | raw, random actions: steps/s (episode length; CPU per "
        "step) | collect with that run's policy | this backend's train window / raw, / collect |",
        "|---|---|---|---:|---:|---:|",
        *rows,
    ]


def plan(a: argparse.Namespace):
    run = {
        "raw": (raw, a.raw_s + 25),
        "again": (raw, a.raw_s + 25),
        "probe": (probe, 30.0),
        "train": (train, a.train_s + 45),
        "states": (states, 2 * a.raw_s + 40),
    }
    steps = []
    for env in a.env_list:
        for part in (p for p in PARTS if p in a.part_list):
            fn, limit_s = run[part]
            for b in a.backend_list:
                steps.append(
                    Step(f"{part}-{env}-{b}", lambda f=fn, e=env, b=b: f(a, e, b), limit_s)
                )
    return steps, print_table(table, a.markdown)
