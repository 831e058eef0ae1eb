"""``autotune daemon start|stop|run`` and ``autotune status`` (see ``autotune.control.daemon``)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune.cli.output import json_safe, write_json
from autotune.cli.status_view import render, render_machine
from autotune.control import protocol
from autotune.control.keys import keys_dir
from autotune.control.machine import reserve_problem
from autotune.control.protocol import MsgType

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


def add_daemon_commands(sub: Any) -> None:
    control_help = (
        "control endpoint: ipc://PATH or tcp://127.0.0.1:PORT (CURVE-authenticated: run "
        "'autotune daemon keys' first; default "
        "$AUTOTUNE_CONTROL, else ipc://<private state dir>/control.sock)"
    )
    daemon = sub.add_parser(
        "daemon",
        help="start or stop the background tuning daemon that 'train --tune' registers with",
        description="The daemon tunes every 'autotune train --tune' job that registers with it, "
        "keeps their trials in each job's Optuna storage, and resumes those studies when it is "
        "started again. It shares the machine out among those jobs: each gets a budget of "
        "cores (its processes are pinned there), a GPU and an MPS share, re-partitioned as jobs "
        "come and go, to maximise the machine's steps per joule above a fairness floor per job. "
        "One daemon runs per state dir. Jobs keep training with their current config while no "
        "daemon runs.",
    )
    daemon.add_argument(
        "action",
        choices=["start", "stop", "run", "keys"],
        help="start (background), stop (cleanly), run (foreground), or keys: make the CURVE "
        "keys a tcp:// control endpoint needs ($AUTOTUNE_KEYS, else <state dir>/keys, 0700)",
    )
    daemon.add_argument(
        "--force",
        action="store_true",
        help="with keys: replace existing keys (clients with the old client key are refused)",
    )
    daemon.add_argument("--control", default=None, help=control_help)
    daemon.add_argument(
        "--reserve-cores",
        type=int,
        default=None,
        metavar="N",
        help="cores of the affinity mask kept back from jobs for the daemon itself (default 0: "
        "it mostly sleeps, and shares the jobs' cores)",
    )
    daemon.add_argument(
        "--log", type=Path, default=None, help="log file (default <state dir>/daemon.log)"
    )
    daemon.set_defaults(func=cmd_daemon)

    status = sub.add_parser(
        "status",
        help="show what the daemon is tuning: config, steps/s, steps/J, best, trial history",
        description="Asks the daemon for the machine it shares out (its cores, GPUs, meters, "
        "what other processes take, and each process still probing in the cores it was "
        "offered) and every registered job's budget, current config, live steps/s and steps/J "
        "(GPU and CPU parts), the best config so far and its trial history. With no daemon, or "
        "with --study for a study no job is tuning, reads the study from --storage instead.",
    )
    status.add_argument("--control", default=None, help=control_help)
    status.add_argument("--study", default=None, help="show only this study")
    status.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="where to read --study when no daemon tunes it (default sqlite:///autotune.db)",
    )
    status.add_argument(
        "--history", type=_count, default=20, help="trials to list (default 20; 0: none)"
    )
    status.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="write the status document to PATH"
    )
    status.set_defaults(func=cmd_status)


def _count(text: str) -> int:
    """A count of 0 or more (argparse's type: a bad one is an error that says so)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 0 or more")
    return value


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmd_daemon(args: argparse.Namespace) -> int:
    console = Console(stderr=True, emoji=False)
    try:
        if args.action == "keys":
            return _keys(console, args.force)
        endpoint = protocol.resolve_endpoint(args.control)
        return _daemon(console, args, endpoint)
    except protocol.ControlError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2


def _keys(console: Console, force: bool) -> int:
    from autotune.control.keys import generate

    path, made = generate(force=force)
    if made:
        console.print(
            f"CURVE keys written to {path} (server and client pairs; the client key is allowed "
            "in authorized/). Start the daemon with --control tcp://127.0.0.1:PORT; jobs and "
            "clients of this user find the keys there"
        )
    else:
        console.print(f"CURVE keys already in {path} (kept; --force makes new ones)")
    return 0


def _daemon(console: Console, args: argparse.Namespace, endpoint: str) -> int:
    if args.action in ("start", "run") and (why := reserve_problem(args.reserve_cores)):
        console.print(f"[red]error:[/red] --reserve-cores: {escape(why)}")
        return 2
    if args.action == "run":
        from autotune.control.daemon import run_daemon  # optuna: only for the daemon

        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
        )
        return run_daemon(endpoint, args.reserve_cores)
    pong = protocol.request(endpoint, MsgType.PING, timeout_s=1.0)
    if args.action == "stop":
        if pong is None:
            console.print(f"no daemon running on {endpoint}")
            return 0
        answer = protocol.request(endpoint, MsgType.STOP)
        pid = int((answer or pong)["pid"])
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            console.print(
                f"[red]error:[/red] daemon {pid} did not stop within "
                f"{STOP_TIMEOUT_S:.0f} s; kill it with: kill {pid}"
            )
            return 1
        console.print(f"daemon {pid} stopped (jobs keep training with their current config)")
        return 0
    if pong is not None:
        console.print(f"a daemon already runs on {endpoint} (pid {pong['pid']})")
        return 0
    log = args.log or protocol.state_dir() / "daemon.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    before = log.stat().st_size if log.exists() else 0  # what earlier daemons wrote
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", "daemon", "run", "--control", endpoint]
            + ([] if args.reserve_cores is None else ["--reserve-cores", str(args.reserve_cores)]),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            env={  # absolute paths: the daemon runs from "/"
                **os.environ,
                "AUTOTUNE_HOME": str(protocol.state_dir()),
                **({"AUTOTUNE_KEYS": str(keys_dir())} if os.environ.get("AUTOTUNE_KEYS") else {}),
                **_absolute("AUTOTUNE_MACHINE_LOCKS"),
            },
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log, "rb") as f:  # this start's lines only
                f.seek(before)
                tail = f.read().decode(errors="replace").splitlines()[-5:]
            console.print(
                f"[red]error:[/red] the daemon exited ({proc.returncode}):\n"
                + escape("\n".join(tail))
            )
            return 1
        pong = protocol.request(endpoint, MsgType.PING, timeout_s=0.5)
        if pong is not None and pong["pid"] == proc.pid:
            console.print(f"daemon started (pid {proc.pid}) on {endpoint}; log {log}")
            return 0
        time.sleep(0.1)
    console.print(
        f"[red]error:[/red] the daemon (pid {proc.pid}) did not answer within "
        f"{START_TIMEOUT_S:.0f} s; see {log}"
    )
    return 1


def cmd_status(args: argparse.Namespace) -> int:
    console = Console(emoji=False)
    try:
        endpoint = protocol.resolve_endpoint(args.control)
        answer = protocol.request(endpoint, MsgType.STATUS)
    except protocol.ControlError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    doc: dict[str, Any] = {"daemon": None, "machine": None, "jobs": []}
    if answer is None:
        console.print(f"no daemon running on {endpoint}")
    else:
        status = answer["status"]
        doc["daemon"] = {k: v for k, v in status.items() if k not in ("jobs", "machine")}
        doc["machine"] = status.get("machine")
        jobs = status["jobs"]
        doc["jobs"] = [j for j in jobs if args.study in (None, j["study"])]
        console.print(
            f"daemon {doc['daemon']['pid']} on {endpoint}, up "
            f"{doc['daemon']['uptime_s']:.0f} s, {len(jobs)} job(s)"
        )
        render_machine(console, status)
    if args.study is not None and not doc["jobs"]:
        from autotune.control.status import stored_status  # optuna: only to read storage
        from autotune.tuning.storage import StudyError

        try:
            doc["jobs"] = [stored_status(args.storage, args.study)]
        except StudyError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            return 1
        console.print("(read from storage: no job is tuning it now)")
    elif answer is None:
        console.print("give --study NAME [--storage URL] to read a stored study")
    for job in doc["jobs"]:
        render(console, job, args.history)
    write_json(args.json, json_safe(doc))
    return 0


def _absolute(name: str) -> dict[str, str]:
    """``{name: its value made absolute}`` where the variable is set, else nothing."""
    value = os.environ.get(name)
    return {name: os.path.abspath(value)} if value else {}
