"""Spare GMI processes (``runtime.gmi.spares``): started ahead with torch imported, they become
the next generation's GMIs; as real processes on the CPU."""

from __future__ import annotations

import mmap
import multiprocessing as mp

import pytest

from runtime.gmi import spares as spares_mod
from runtime.gmi.process import cuda_driver_started
from runtime.gmi.spares import Spares, spares_allowed
from runtime.runner import Runner
from tests.runtime.test_gmis import assert_nothing_lost, small


@pytest.mark.slow
def test_a_hand_over_after_the_first_starts_its_gmi_from_a_spare_with_torch_imported():
    """The first hand-over of a run that did not expect one starts its GMI afresh; from then on
    a spare waits, and the next generation's GMI starts from it: torch is imported already, its
    start counts from the hand-over, and the steps and the learner carry over as before."""
    cfg = small(steps=10**9)
    runner = Runner(cfg, cfg.validate())

    def hand_over_twice(state):
        gen = runner.generation
        trained = runner.telemetry.source(f"trainer-0.g{gen}").get("trained_steps", 0)
        if gen == 0 and state.trained_steps >= 4_000:
            runner.request_replace()
        elif gen == 1 and trained >= cfg.batch_size and runner.fleet.spares.ready():
            runner.request_replace()  # a spare has imported torch and waits for a role
        elif gen == 2 and trained >= cfg.batch_size:
            runner.stop_requested = True

    runner.on_progress = hand_over_twice
    result = runner.run()
    assert_nothing_lost(result)
    assert result["failure"] is None and result["weights_identical"]
    assert [h["generation"] for h in result["gmi_handovers"]] == [1, 2]
    assert result["gmi_spares"] == 1
    by_gen = {g["generation"]: g for g in result["gmis"]}
    assert "spare_s" not in by_gen[0]["startup"] and "spare_s" not in by_gen[1]["startup"]
    spare = by_gen[2]["startup"]
    assert spare["spare_s"] > 0
    # torch was in the spare before the role came: its import is a dictionary lookup
    assert spare["torch_import_s"] < by_gen[1]["startup"]["torch_import_s"]
    assert by_gen[1]["retired"] and by_gen[2]["resumed"] and by_gen[2]["trained_steps"] > 0
    assert not runner.fleet.spares.idle  # the run's end let the next spare go


def _spares(adopted: list[str], **kw) -> Spares:
    return Spares(mp.get_context("spawn"), lambda name, _: adopted.append(name), **kw)


def test_spares_start_only_as_wanted_and_a_stop_ends_every_idle_one():
    adopted: list[str] = []
    spares = _spares(adopted)
    spares.top_up()
    assert spares.idle == []  # none wanted
    spares.wanted = 1
    spares.top_up()
    spares.top_up()  # topped up, not added to
    (spare,) = spares.idle
    assert spare.proc.is_alive()
    spares.stop()
    assert spares.idle == [] and not spare.proc.is_alive() and adopted == []


def test_a_spare_not_yet_ready_is_not_given_a_role_and_one_that_died_idle_ends_spares():
    adopted: list[str] = []
    spares = _spares(adopted)
    spares.wanted = 1
    spares.top_up()
    (spare,) = spares.idle
    if not spares.ready():  # still importing torch: the caller starts the GMI afresh
        assert spares.take("trainer-0.g1", ()) is False and spares.idle == [spare]
    spare.proc.kill()
    spare.proc.join(timeout=10)
    assert spares.take("trainer-0.g1", ()) is False
    assert spares.idle == [] and adopted == [] and spares.taken == 0
    spares.top_up()  # a spare that exits idle would again: none more in this run
    assert spares.idle == [] and not spares.allowed


def test_a_spare_whose_imports_start_the_cuda_driver_exits_unready_and_ends_spares():
    """The driver reads the MPS share as it starts: a spare that started it before its role was
    known must never become a GMI (a module that keeps a file named nvidiactl open stands for
    the import that did)."""
    adopted: list[str] = []
    spares = _spares(adopted, modules=("tests.runtime.fake_cuda_driver",))
    spares.wanted = 1
    spares.top_up()
    (spare,) = spares.idle
    spare.proc.join(timeout=120)  # its imports done, it exits: it never says it is ready
    assert spare.proc.exitcode == 3
    assert spares.take("trainer-0.g1", ()) is False
    assert adopted == [] and spares.taken == 0 and not spares.allowed


def test_the_driver_counts_as_started_by_its_open_device_node_not_by_its_library(tmp_path):
    """``cuInit`` opens ``/dev/nvidiactl``; a torch built with CUDA maps ``libcuda`` on import
    without starting it, and such a spare is still good."""
    if cuda_driver_started():  # a GPU host where this process has met the driver (NVML)
        pytest.skip("this test process has the CUDA driver's nodes open already")
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * mmap.PAGESIZE)
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ):
        assert not cuda_driver_started()
    with open(tmp_path / "nvidiactl", "wb"):
        assert cuda_driver_started()
    with open(tmp_path / "nvidia-uvm", "wb"), open(tmp_path / "nvidia-smi.log", "wb"):
        assert cuda_driver_started()
    assert not cuda_driver_started()


@pytest.mark.parametrize(("value", "allowed"), [("", True), ("1", True), ("0", False)])
def test_the_spares_switch_reads_0_or_1(monkeypatch, value, allowed):
    monkeypatch.setenv(spares_mod.SPARES_ENV, value)
    assert spares_allowed() is allowed


def test_a_bad_spares_switch_is_refused_before_a_run_starts(monkeypatch):
    monkeypatch.setenv(spares_mod.SPARES_ENV, "yes")
    cfg = small()
    with pytest.raises(ValueError, match="AUTOTUNE_GMI_SPARES='yes': allowed are 0"):
        Runner(cfg, cfg.validate())


@pytest.mark.slow
def test_a_run_given_a_spare_started_ahead_starts_its_first_gmi_from_it():
    """A spare started before the run (as ``autotune train`` starts one while its probes time
    the GPU learner) becomes the run's first GMI once it is ready: torch was imported in it
    before the run began, and the run trains and accounts as any other."""
    from conftest import wait_until

    from runtime.gmi.spares import started_ahead

    ahead = started_ahead(min_cores=1)  # a CI machine has 2 cores: the run may use 1 here
    assert ahead is not None and len(ahead.idle) == 1
    wait_until(lambda: ahead.ready() == 1, what="the spare's imports")
    cfg = small(steps=4_000)
    runner = Runner(cfg, cfg.validate(), spares=ahead)
    result = runner.run()
    assert_nothing_lost(result)
    assert result["failure"] is None and result["gmi_spares"] == 1
    (gmi,) = result["gmis"]
    assert gmi["startup"]["spare_s"] > 0 and gmi["trained_steps"] > 0
    assert not ahead.idle  # taken; none is kept for a run that replaces no GMI


def test_a_spare_started_ahead_is_refused_a_role_before_a_run_takes_it(monkeypatch):
    from runtime.gmi.spares import started_ahead

    monkeypatch.setenv(spares_mod.SPARES_ENV, "0")
    assert started_ahead(min_cores=1) is None  # spares off: none started ahead either
    monkeypatch.delenv(spares_mod.SPARES_ENV)
    import os

    cores = len(os.sched_getaffinity(0))
    assert started_ahead(min_cores=cores + 1) is None  # too few cores to import beside probes
    ahead = started_ahead(modules=(), min_cores=1)
    try:
        with pytest.raises(RuntimeError, match="before a run took it"):
            ahead.adopt("trainer-0.g0", ahead.idle[0].proc)
    finally:
        ahead.stop()
    assert not ahead.idle
