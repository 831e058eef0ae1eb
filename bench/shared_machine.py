"""Several training jobs on one machine, run three ways, with the whole machine's energy
sampled over the whole span (``bench.machine_meter``) so the ways compare as one machine's
trained steps per joule:

* ``sequential``: each job alone, one after the other, sized by ``auto`` for the whole machine;
* ``together``: the jobs start at their offsets with no daemon, each sized as if it owned the
  machine (what several users' jobs do today);
* ``daemon``: the jobs start at their offsets with ``--tune`` under a daemon, which shares the
  machine out among them (``autotune.control.sharing``).

A job is ``WORKLOAD@START+SECONDS``: a workload of ``bench.suites.peers.WORKLOADS`` (or a
gymnasium id), its start offset and its wall budget (``--max-wall-s``, start-up included). Every
job's figures come from its result (trained steps, lost steps) and its progress file; in the
``daemon`` way, ``autotune status --json`` is read every ``STATUS_S`` for each job's cores and
steps/s over time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import read_progress
from bench.compare import cache_env
from bench.machine_meter import MachineMeter

WAYS = ("sequential", "together", "daemon")
STATUS_S = 5.0
GRACE_S = 240.0
"""How long past its wall budget a job may take (probes, drain) before it is stopped."""


@dataclass(frozen=True)
class JobSpec:
    name: str
    env: str
    policy: str
    start_s: float
    seconds: float


def parse_jobs(text: str, workloads: dict[str, tuple[str, str]]) -> list[JobSpec]:
    """``ant@0+180,ant@30+120,humanoid@60+180`` as job specs (named ``<workload>-<i>``).

    Raises:
        ValueError: naming the malformed item and the form allowed.
    """
    out = []
    for i, item in enumerate(x.strip() for x in text.split(",") if x.strip()):
        try:
            work, _, when = item.partition("@")
            start, _, secs = when.partition("+")
            start_s, seconds = float(start), float(secs)
            if start_s < 0 or seconds <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"job {item!r}: expected WORKLOAD@START+SECONDS, e.g. ant@30+180"
            ) from None
        env, policy = workloads.get(work, (work, "auto"))
        out.append(JobSpec(f"{work}-{i}", env, policy, start_s, seconds))
    if not out:
        raise ValueError("no jobs given")
    return out


def job_command(spec: JobSpec, way: str, out_dir: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "train",
        "--env",
        spec.env,
        "--policy",
        spec.policy,
        "--steps",
        "1000000000",
        "--max-wall-s",
        str(spec.seconds),
        "--quiet",
        "--progress",
        str(out_dir / f"{spec.name}.progress.jsonl"),
        "--json",
        str(out_dir / f"{spec.name}.result.json"),
    ]
    if way == "daemon":
        cmd += [
            "--tune",
            "--storage",
            f"sqlite:///{out_dir.resolve() / spec.name}.db",
            "--study",
            spec.name,
            "--tune-warmup-s",
            "4",
        ]
    return cmd


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autotune.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def run_way(
    specs: list[JobSpec], way: str, out_dir: Path, fresh_cache: bool = True
) -> dict[str, Any]:
    """Runs the jobs one way (see the module docstring); returns the machine's and each job's
    figures. Each way starts with an empty probe cache (``fresh_cache``; a later part of the
    same way keeps what its first part probed): a job probes its workload unless a job of
    this way probed it before, as on a machine that ran none of them yet."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AUTOTUNE_HOME": str(out_dir / "home"), "AUTOTUNE_CONTROL": ""}
    env = cache_env(out_dir / "cache", env)
    if fresh_cache:
        shutil.rmtree(out_dir / "cache", ignore_errors=True)
    if way == "daemon":
        started = _cli(env, "daemon", "start")
        if started.returncode != 0:
            raise RuntimeError(f"the daemon did not start: {started.stderr}")
    meter = MachineMeter().start()
    t0 = time.time()
    waiting = sorted(specs, key=lambda s: s.start_s)
    running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
    started_at: dict[str, float] = {}
    timeline: list[dict[str, Any]] = []
    next_status = t0
    try:
        while waiting or running:
            now = time.time()
            due = waiting and (
                not running if way == "sequential" else now - t0 >= waiting[0].start_s
            )
            if due:
                spec = waiting.pop(0)
                log = (out_dir / f"{spec.name}.log").open("w")
                proc = subprocess.Popen(
                    job_command(spec, way, out_dir), env=env, stdout=log, stderr=subprocess.STDOUT
                )
                running[spec.name] = (proc, now + spec.seconds + GRACE_S, log)
                started_at[spec.name] = now
                continue
            for name, (proc, deadline, log) in list(running.items()):
                if proc.poll() is not None or now > deadline:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    log.close()
                    del running[name]
            if now >= next_status:
                timeline += _snapshot(env, way, running, now - t0)
                next_status = now + STATUS_S
            time.sleep(0.5)
    finally:
        for proc, _, log in running.values():
            proc.kill()
            log.close()
        if way == "daemon":
            _cli(env, "daemon", "stop")
        meter.stop()
    return _figures(specs, way, out_dir, meter, t0, started_at, timeline)


def _snapshot(env, way, running, t) -> list[dict[str, Any]]:
    """Each running job's cores now (the daemon's budget, else its affinity) and, under the
    daemon, its live steps/s."""
    if way == "daemon":
        path = Path(env["AUTOTUNE_HOME"]) / "status.json"
        if _cli(env, "status", "--json", str(path)).returncode == 0 and path.exists():
            jobs = json.loads(path.read_text())["jobs"]
            return [
                {
                    "t": t,
                    "job": j["study"],
                    "cores": (j.get("allocation") or {}).get("cores"),
                    "mps_pct": (j.get("allocation") or {}).get("mps_pct"),
                    "steps_per_s": j.get("steps_per_s"),
                }
                for j in jobs
            ]
    out = []
    for name, (proc, _, _) in running.items():
        try:
            cores = sorted(os.sched_getaffinity(proc.pid))
        except OSError:
            continue
        out.append({"t": t, "job": name, "cores": cores, "mps_pct": None, "steps_per_s": None})
    return out


def _figures(specs, way, out_dir, meter, t0, started_at, timeline) -> dict[str, Any]:
    jobs, steps, lost = {}, 0, 0
    ends = []
    for spec in specs:
        path = out_dir / f"{spec.name}.result.json"
        res = json.loads(path.read_text()) if path.exists() else {}
        try:
            rows = read_progress(out_dir / f"{spec.name}.progress.jsonl")
        except (OSError, ValueError):
            rows = []
        trained = int(res.get("env_steps", rows[-1]["steps"] if rows else 0))
        steps += trained
        lost += int(res.get("lost_steps") or 0)
        if rows:
            ends.append(rows[-1]["t"])
        start = started_at.get(spec.name, t0)
        probes = (res.get("sizing") or {}).get("probes") or {}
        jobs[spec.name] = {
            **asdict(spec),
            "started_s": start - t0,
            # its start-up: the probes (none: read from the cache) and the first trained batch
            "probe_s": None if probes.get("cached", True) else probes.get("probe_s"),
            "gpu_busy_pct": probes.get("gpu_busy_pct"),
            "first_trained_s": next((r["t"] - start for r in rows if r["steps"] > 0), None),
            "steps": trained,
            "wall_s": res.get("wall_s"),
            "steps_per_s": res.get("steps_per_s"),
            "lost_steps": res.get("lost_steps"),
            "invariant": bool(res)
            and res["sampled_steps"]
            == res["env_steps"] + res["discarded_steps"] + res["lost_steps"],
            "config": {k: (res.get("config") or {}).get(k) for k in ("actors", "envs_per_actor")},
            "progress": [{"t": r["t"] - t0, "steps": r["steps"]} for r in rows],
            "error": None if res else f"no result (log: {spec.name}.log)",
        }
    end = min(max(ends, default=meter.samples[-1][0]), meter.samples[-1][0])
    (g0, c0, i0), (g1, c1, i1) = meter.parts_at(meter.samples[0][0]), meter.parts_at(end)
    joules = (g1 - g0) + (c1 - c0)
    return {
        "way": way,
        **meter.sources,
        "seconds": end - meter.samples[0][0],
        "steps": steps,
        "lost_steps": lost,
        "gpu_j": g1 - g0,
        "cpu_j": c1 - c0,
        "steps_per_s": steps / max(end - meter.samples[0][0], 1e-9),
        "steps_per_joule": steps / joules if joules > 0 else None,
        "steps_per_joule_busy_only": steps / (joules - (i1 - i0))
        if meter.has_idle_part and joules > i1 - i0
        else None,
        "idle_j": i1 - i0,
        "jobs": jobs,
        "timeline": timeline,
    }


def joined(parts: list[dict[str, Any]], way: str = "sequential") -> dict[str, Any]:
    """One way's figures from runs of its jobs one after the other, each measured on its own
    (the ``sequential`` way in parts): spans, steps and joules add up, and each job's start and
    progress times are moved to where its part began."""
    out: dict[str, Any] = {"way": way, "jobs": {}, "timeline": []}
    for key in ("seconds", "steps", "lost_steps", "gpu_j", "cpu_j", "idle_j"):
        out[key] = sum(p.get(key) or 0 for p in parts)
    offset = 0.0
    for p in parts:
        for name, job in p["jobs"].items():
            out["jobs"][name] = {
                **job,
                "started_s": job["started_s"] + offset,
                "progress": [{**r, "t": r["t"] + offset} for r in job["progress"]],
            }
        offset += p["seconds"]
    joules = out["gpu_j"] + out["cpu_j"]
    out["steps_per_s"] = out["steps"] / max(out["seconds"], 1e-9)
    out["steps_per_joule"] = out["steps"] / joules if joules > 0 else None
    busy = joules - out["idle_j"]
    modelled = all(p.get("cpu") != "rapl" for p in parts)  # RAPL: no busy-only figure
    out["steps_per_joule_busy_only"] = out["steps"] / busy if modelled and busy > 0 else None
    return out
