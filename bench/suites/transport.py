"""A run's links on ipc against tcp with CURVE (and its actors as Ray actors): the same config,
the same cores, side by side.

    python -m bench transport --env Ant-v5 --rounds 2 --train-s 90 --arms ipc,tcp,ray \\
        --markdown out/transport/table.md --out out/transport

Steps: ``train-<arm>-<k>`` for each arm and round ``k``, alternating, so that a drift of the
machine falls on every arm. The ``ray`` arm runs the actors on a local Ray cluster of
``--ray-nodes`` nodes (``--cluster local:N``, the cores shared out among them), over the same
tcp links with CURVE. The first arm sizes itself (``auto``, or ``--train-args``);
every later arm runs that config again as explicit flags, so only the transport differs. The
tcp arms bind ``--bind-host``: by default this machine's first non-loopback IPv4 address, so
the links go through the host's network stack rather than loopback alone (127.0.0.1 where it has
none, said in the table). Every tcp link is encrypted and authenticated with CURVE
(``runtime.curve``). Figures: each arm's window (from ``--warmup-s`` after its first trained
step) and whole run, and tcp / ipc of their means.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from bench.suite import Step, print_table
from bench.train_run import add_train_steps_arg, check_train_steps

ARMS = ("ipc", "tcp", "ray")
NAME = "transport"
HELP = "a run's links on ipc against tcp with CURVE, same config, alternating rounds"


def host_address() -> tuple[str, str]:
    """This machine's first non-loopback IPv4 address of an interface that is up, and where
    it came from (127.0.0.1 where there is none)."""
    import psutil

    stats = psutil.net_if_stats()
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        if not (stats.get(name) and stats[name].isup):
            continue
        for addr in addrs:
            if addr.family.name == "AF_INET" and not addr.address.startswith("127."):
                return addr.address, f"interface {name}"
    return "127.0.0.1", "loopback: no other IPv4 interface is up"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--env", default="Ant-v5")
    ap.add_argument("--policy", default="auto:256:128:64:auto", help="every arm's MLP")
    ap.add_argument(
        "--train-args", default="", help="more autotune train flags for every arm (one string)"
    )
    ap.add_argument("--bind-host", default=None, help="the tcp arms' address (default: see above)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the arms, alternating")
    ap.add_argument(
        "--arms", default="ipc,tcp", help="of ipc, tcp, ray (the first sizes the config: not ray)"
    )
    ap.add_argument("--ray-nodes", type=int, default=1, help="the ray arm's local Ray nodes")
    ap.add_argument("--train-s", type=float, default=90.0, help="wall budget of an arm")
    add_train_steps_arg(ap)
    ap.add_argument("--warmup-s", type=float, default=10.0, help="left out of an arm's window")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="the table, as markdown")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.rounds < 1 or not (a.train_s > 0 and a.warmup_s >= 0):
        ap.error("--rounds must be >= 1, --train-s > 0 and --warmup-s >= 0")
    a.arm_list = [x.strip() for x in a.arms.split(",") if x.strip()]
    if not a.arm_list or any(x not in ARMS for x in a.arm_list) or a.arm_list[0] == "ray":
        ap.error(f"--arms {a.arms!r}: allowed {', '.join(ARMS)}, the first not ray")
    if not 1 <= a.ray_nodes <= 64:
        ap.error(f"--ray-nodes {a.ray_nodes}: allowed 1 to 64")
    check_train_steps(ap, a)
    try:
        a.extra = shlex.split(a.train_args)
    except ValueError as exc:
        ap.error(f"--train-args: {exc}")
    bad = [f for f in a.extra if f.split("=")[0] in ("--transport", "--bind-host", "--cluster")]
    if bad:
        ap.error(f"--train-args: {bad[0]} is the suite's to set (use --bind-host)")
    if a.bind_host is None:
        a.bind_host, a.bind_source = host_address()
    else:
        a.bind_source = "--bind-host"


def arm(a: argparse.Namespace, transport: str, k: int) -> dict:
    from bench.train_run import sized_flags, train_run

    runs = Path(a.out) / "runs"
    flags = ["--env", a.env, "--policy", a.policy, *a.extra]
    flags += ["--transport", "ipc" if transport == "ipc" else "tcp"]
    if transport != "ipc":
        flags += ["--bind-host", a.bind_host]
    if transport == "ray":
        flags += ["--cluster", f"local:{a.ray_nodes}"]
    first = runs / "first-arm.json"  # kept beside the runs, so a resumed suite has it too
    if first.exists():  # the first arm's config, as given: only the transport differs
        flags += sized_flags(json.loads(first.read_text()))
    out = train_run(runs / f"{transport}-{k}", flags, a.train_s, a.warmup_s, a.train_steps)
    if "config" in out and not first.exists():
        first.write_text(json.dumps(out))
    if transport != "ipc":
        out["bind_host"], out["bind_source"] = a.bind_host, a.bind_source
    if transport == "ray":
        out["transport"] = f"ray, {a.ray_nodes} local node(s), tcp"
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def table(results: dict) -> str:
    rows = [
        "| arm | transport | config | window steps/s | whole-run steps/s | steps/J | "
        "lost | auth refused |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    means: dict[str, dict[str, list[float]]] = {}
    for name, r in results.items():
        if "window_steps_per_s" not in r:
            rows.append(f"| {name} | | failed: {r.get('why') or r.get('stderr', '')[-200:]} |")
            continue
        c = r["config"]
        knobs = f"{c.get('actors')} x {c.get('envs_per_actor')}, b{c.get('batch_size')}, "
        where = f" on {r['bind_host']} ({r['bind_source']})" if r.get("bind_host") else ""
        spj = r.get("steps_per_joule")
        rows.append(
            f"| {name} | {r['transport']}{where} | {knobs}{c.get('trainer_device')} | "
            f"{r['window_steps_per_s']:,.0f} | {r['whole_steps_per_s']:,.0f} | "
            f"{'' if spj is None else f'{spj:.1f}'} | {r['lost_steps']} | {r['auth_refused']} |"
        )
        m = means.setdefault(name.split("-")[1], {"window": [], "whole": []})
        m["window"].append(r["window_steps_per_s"])
        m["whole"].append(r["whole_steps_per_s"])
    text = "\n".join(rows) + "\n"
    for arm in ("tcp", "ray"):
        if "ipc" in means and arm in means:
            ratio = {k: _mean(means[arm][k]) / _mean(means["ipc"][k]) for k in ("window", "whole")}
            text += (
                f"\n{arm} / ipc trained steps/s, means over rounds: window "
                f"**{ratio['window']:.2f}**, whole run {ratio['whole']:.2f}\n"
            )
    return text


def plan(a: argparse.Namespace):
    steps = [
        Step(f"train-{t}-{k}", lambda t=t, k=k: arm(a, t, k), a.train_s + 90)
        for k in range(1, a.rounds + 1)
        for t in a.arm_list
    ]

    return steps, print_table(table, a.markdown)
