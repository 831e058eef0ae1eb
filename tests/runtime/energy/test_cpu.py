"""Tests for runtime.energy.cpu against a fake powercap tree and patched psutil."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.energy import cpu

MAX_UJ = 1_000_000_000


def write_zone(root: Path, name: str, kind: str, energy_uj: int) -> Path:
    """Creates one powercap zone directory with name, energy and range files."""
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(f"{kind}\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{MAX_UJ}\n")
    return zone


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, a DRAM subzone, a psys zone and the bare control-type dir."""
    write_zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 7_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", "dram", 1_000_000)
    write_zone(tmp_path, "intel-rapl:2", "psys", 9_000_000)
    (tmp_path / "intel-rapl").mkdir()
    return tmp_path


@pytest.fixture(autouse=True)
def _clear_probe_cache() -> Iterator[None]:
    cpu.probe_cpu_energy.cache_clear()
    yield
    cpu.probe_cpu_energy.cache_clear()


def set_uj(root: Path, zone: str, energy_uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_packages_and_ignores_subzones(powercap: Path) -> None:
    rapl = cpu.RaplEnergy(powercap)
    assert rapl.source == "rapl"
    assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert rapl.read_energy_j() == 0.0
    set_uj(powercap, "intel-rapl:0", 8_000_000)  # +3 J
    set_uj(powercap, "intel-rapl:1", 8_000_000)  # +1 J
    set_uj(powercap, "intel-rapl:0:0", 900_000_000)  # subzone: ignored
    set_uj(powercap, "intel-rapl:2", 900_000_000)  # psys: ignored
    assert rapl.read_energy_j() == pytest.approx(4.0)


def test_rapl_wraparound(powercap: Path) -> None:
    set_uj(powercap, "intel-rapl:0", MAX_UJ - 2_000_000)
    rapl = cpu.RaplEnergy(powercap)
    set_uj(powercap, "intel-rapl:0", 500_000)  # wrapped: 2 J + 0.5 J
    assert rapl.read_energy_j() == pytest.approx(2.5)
    set_uj(powercap, "intel-rapl:0", 1_500_000)
    assert rapl.read_energy_j() == pytest.approx(3.5)


def test_probe_uses_rapl_when_readable(powercap: Path) -> None:
    assert isinstance(cpu.probe_cpu_energy(powercap), cpu.RaplEnergy)


def test_probe_falls_back_when_unreadable(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_read_text = Path.read_text
    unreadable = powercap / "intel-rapl:1" / "energy_uj"

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self == unreadable:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    # Patched rather than chmod so the test also holds when run as root.
    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(cpu.CPUEnergyError, match="Permission denied"):
        cpu.RaplEnergy(powercap)
    source = cpu.probe_cpu_energy(powercap)
    assert isinstance(source, cpu.CPUModelEnergy)
    assert source.source == "model"


def test_probe_falls_back_without_powercap(tmp_path: Path) -> None:
    assert cpu.probe_cpu_energy(tmp_path / "missing").source == "model"
    assert cpu.probe_cpu_energy(tmp_path).source == "model"  # empty tree


def cpu_times(busy_s: float, idle_s: float) -> types.SimpleNamespace:
    """A cpu_times() result whose busy fields sum to ``busy_s``."""
    share = busy_s / 6
    return types.SimpleNamespace(
        user=share,
        nice=share,
        system=share,
        irq=share,
        softirq=share,
        steal=share,
        idle=idle_s,
        iowait=idle_s,
        guest=1e6,
        guest_nice=1e6,
    )


def test_model_energy_is_watts_times_busy_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([cpu_times(100.0, 50.0), cpu_times(112.0, 500.0), cpu_times(111.0, 600.0)])
    monkeypatch.setattr(cpu.psutil, "cpu_times", lambda: next(samples))
    model = cpu.CPUModelEnergy(watts_per_busy_core=7.5)
    assert model.source == "model"
    assert model.read_energy_j() == pytest.approx(7.5 * 12.0)  # idle, iowait, guest ignored
    assert model.read_energy_j() == pytest.approx(7.5 * 12.0)  # never goes backwards


def test_model_default_watts() -> None:
    assert cpu.CPUModelEnergy().watts_per_busy_core == cpu.DEFAULT_WATTS_PER_BUSY_CORE


def test_process_tree_model_counts_busy_child() -> None:
    model = cpu.CPUModelEnergy(watts_per_busy_core=10.0, pids=lambda: [os.getpid()])
    spin = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)  # reaped: counted as children
    assert model.read_energy_j() >= 10.0 * 0.2 * 0.9


def test_a_child_read_alive_then_reaped_by_its_listed_parent_is_counted_once() -> None:
    """A wrapped script's worker, or a study worker's actor: read while it runs, then reaped by
    its parent, whose children times then hold it. Its CPU seconds count once."""
    from runtime.energy.cpu import tree_pids

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}])\n"
        "time.sleep(0.5)\n"  # its child reaped: read once more before it exits
    )
    root = subprocess.Popen([sys.executable, "-c", parent])
    model = cpu.CPUModelEnergy(watts_per_busy_core=1.0, pids=lambda: tree_pids(root.pid))
    seen_child = 0
    while root.poll() is None:  # read as the tree changes, as the wrap does
        seen_child = max(seen_child, len(tree_pids(root.pid)) - 1)
        model.read_energy_j()
        time.sleep(0.05)
    charged = model.read_energy_j()
    assert seen_child >= 1  # the child was read alive
    # one second burnt, plus two interpreters' start-ups; twice over it would be past 2 s
    assert 1.0 <= charged < 1.9, charged


def test_process_tree_model_tolerates_vanished_pids() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    pids = [proc.pid, 2**22 + 12345]  # the second never exists
    model = cpu.CPUModelEnergy(pids=lambda: pids)
    proc.wait()
    assert model.read_energy_j() == 0.0  # the exited child keeps its last value


class FakeClock:
    """Monotonic seconds advanced by the test."""

    def __init__(self) -> None:
        self.t_s = 500.0

    def __call__(self) -> float:
        return self.t_s


def test_model_idle_term_charges_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([cpu_times(100.0, 0.0), cpu_times(104.0, 0.0), cpu_times(104.0, 0.0)])
    monkeypatch.setattr(cpu.psutil, "cpu_times", lambda: next(samples))
    clock = FakeClock()
    model = cpu.CPUModelEnergy(10.0, idle_w=52.5, idle_source="explicit", clock=clock)
    clock.t_s += 20.0
    # 52.5 W x 20 s idle + 10 W x 4 busy core-seconds
    assert model.read_energy_parts_j() == pytest.approx((1050.0 + 40.0, 1050.0))
    clock.t_s += 2.0  # nothing busy: the idle term still grows
    assert model.read_energy_j() == pytest.approx(52.5 * 22.0 + 40.0)
    assert model.describe() == {
        "name": "busy-cores+idle",
        "watts_per_busy_core": 10.0,
        "idle_w": 52.5,
        "idle_source": "explicit",
    }


def test_model_without_idle_is_the_busy_only_model(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([cpu_times(0.0, 0.0), cpu_times(3.0, 0.0)])
    monkeypatch.setattr(cpu.psutil, "cpu_times", lambda: next(samples))
    clock = FakeClock()
    model = cpu.CPUModelEnergy(10.0, clock=clock)
    clock.t_s += 100.0
    assert model.read_energy_parts_j() == (30.0, 0.0)
    assert model.describe()["name"] == "busy-cores"
    with pytest.raises(ValueError, match=r"idle_w=-1\.0: must be a number of watts >= 0"):
        cpu.CPUModelEnergy(idle_w=-1.0)


def test_probe_builds_the_model_with_idle_watts(tmp_path: Path) -> None:
    model = cpu.probe_cpu_energy(tmp_path / "missing", idle_w=40.0)
    assert isinstance(model, cpu.CPUModelEnergy)
    assert (model.idle_w, model.idle_source) == (40.0, "explicit: cpu_idle_w=40 W")
    default = cpu.probe_cpu_energy(tmp_path / "missing")
    assert isinstance(default, cpu.CPUModelEnergy)
    assert default.idle_w > 0  # from the TDP table or the labelled per-core fallback
    assert default.idle_source.startswith(("tdp-table: ", "fallback: "))


def test_rapl_has_no_idle_term(powercap: Path) -> None:
    rapl = cpu.probe_cpu_energy(powercap, idle_w=40.0)  # measured whole: idle_w is ignored
    assert isinstance(rapl, cpu.RaplEnergy)
    set_uj(powercap, "intel-rapl:0", 6_000_000)
    assert rapl.read_energy_parts_j() == (pytest.approx(1.0), None)
    assert rapl.describe() is None
