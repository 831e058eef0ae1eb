"""The peers' stop rule: ``--seconds``, then ``--min-steps``, then (with ``--warmup-s``) two
progress lines that far after the first trained one, so a slow rollout on a loaded machine
makes the run longer rather than its window unmeasurable."""

from __future__ import annotations

import argparse

import pytest

from bench.compare import window
from bench.compare_arms import arm_command
from bench.peers.common import StopRule, add_peer_args, check_peer_args


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def rule(**kw) -> tuple[StopRule, Clock]:
    clock = Clock()
    a = argparse.Namespace(seconds=6.0, min_steps=0, warmup_s=None)
    a.__dict__.update(kw)
    return StopRule(a, clock=clock), clock


def test_without_warmup_the_seconds_and_min_steps_alone_stop_the_run():
    stop, clock = rule(min_steps=4096)
    assert not stop.due(8192)
    clock.t += 6
    assert not stop.due(2048) and stop.due(4096)


def test_slow_rollouts_run_on_until_the_window_holds_two_lines():
    # the rollouts a loaded 2-core machine took: a line every 2.7-3.1 s (as measured), a 2-s warm-up
    stop, clock = rule(warmup_s=2.0)
    rows = []
    for steps, dt in ((0, 0.0), (2048, 3.1), (4096, 3.0), (6144, 2.8)):
        clock.t += dt
        stop.line(steps)
        rows.append({"t": clock.t, "steps": steps})
        if steps == 4096:  # 6 s have passed, but only one line lies past the warm-up
            assert clock.t >= 1006 and not stop.due(steps)
            with pytest.raises(ValueError, match="fewer than two progress lines"):
                window(rows, 2.0, False)
    assert stop.due(6144)
    first, last = window(rows, 2.0, False)  # what the benchmark measures
    assert (first["steps"], last["steps"]) == (4096, 6144)


def test_a_resumed_run_counts_its_lines_from_where_it_resumed():
    clock = Clock()
    a = argparse.Namespace(seconds=1.0, min_steps=0, warmup_s=0.0)
    stop = StopRule(a, start_steps=10_000, clock=clock)
    stop.line(10_000)  # the line it resumed at trained nothing new
    clock.t += 2
    stop.line(12_048)
    assert not stop.due(12_048)
    stop.line(14_096)
    assert stop.due(14_096)


@pytest.mark.parametrize(
    "given",
    [["--warmup-s", "-1"], ["--seconds", "-1"], ["--min-steps", "-1"]]
    + [[flag, v] for flag in ("--warmup-s", "--seconds") for v in ("nan", "inf")],
)
def test_negative_or_not_finite_budgets_are_refused_naming_them(given, capsys):
    ap = argparse.ArgumentParser()
    add_peer_args(ap)
    a = ap.parse_args(given)
    with pytest.raises(SystemExit):
        check_peer_args(ap, a)
    assert "--seconds, --min-steps and --warmup-s finite numbers >= 0" in capsys.readouterr().err


def test_a_benchmarks_warm_up_reaches_its_peers(tmp_path):
    a = argparse.Namespace(env="CartPole-v1", policy="auto:64:64:auto", seconds=6.0)
    a.__dict__.update(peer_rollout=2048, min_steps=0)
    cmd = arm_command("sb3-cpu", a, tmp_path / "p", tmp_path / "r")
    assert "--warmup-s" not in cmd
    a.warmup_s = 2.0
    for arm in ("sb3-cpu", "cleanrl"):
        cmd = arm_command(arm, a, tmp_path / "p", tmp_path / "r")
        assert cmd[cmd.index("--warmup-s") + 1] == "2.0"
