"""A service process's start, stage by stage (``runtime.startup_clock``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from runtime import startup_clock
from runtime.startup_clock import StartupClock, process_age_s


def test_a_new_process_reads_its_own_age_within_its_parents_view_of_it():
    code = "from runtime.startup_clock import process_age_s; print(process_age_s())"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.monotonic() - t0
    age = float(out.stdout)
    assert 0.0 < age <= wall + 0.02  # ticks of 10 ms: the child lived no longer than the parent saw
    assert process_age_s() >= age  # this process is older than its child


def test_stages_add_up_to_the_total_and_inner_stages_are_split_out(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(startup_clock.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(startup_clock, "process_age_s", lambda: 1.5)
    clock = StartupClock()
    now[0] += 2.0
    clock.took("torch_import")
    now[0] += 0.25
    clock.took("sockets")
    now[0] += 4.0  # the learner's build and its compile, timed by the callee inside this span
    doc = clock.doc({"learner": 1.0, "compile": 2.5})
    assert doc == {
        "boot_s": 1.5,
        "torch_import_s": 2.0,
        "sockets_s": 0.25,
        "rest_s": 0.5,
        "learner_s": 1.0,
        "compile_s": 2.5,
        "total_s": 7.75,
    }
    assert sum(v for k, v in doc.items() if k != "total_s") == pytest.approx(doc["total_s"])


def test_a_spare_counts_its_start_from_the_hand_over_and_says_how_long_it_waited(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(startup_clock.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(startup_clock, "process_age_s", lambda: 30.0)  # up for 30 s
    clock = StartupClock(asked_at=99.75)  # handed its role 0.25 s ago
    now[0] += 0.5
    clock.took("torch_import")
    doc = clock.doc()
    assert doc == {
        "boot_s": 0.25,
        "spare_s": 29.75,
        "torch_import_s": 0.5,
        "rest_s": 0.0,
        "total_s": 0.75,
    }
