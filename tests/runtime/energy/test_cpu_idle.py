"""Tests for runtime.energy.cpu_idle: the TDP table, /proc/cpuinfo parsing, the idle estimate,
and TrainConfig.cpu_idle_w's validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import ConfigError, TrainConfig
from runtime.energy import cpu_idle
from runtime.energy.cpu_idle import CPUInfo, IdleEstimate

TWO_SOCKETS = "\n".join(
    f"processor\t: {cpu}\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    f"physical id\t: {cpu // 4}\ncore id\t\t: {cpu % 4 // 2}\n"
    for cpu in range(8)  # 2 packages x 2 cores x 2 hyperthreads
)


def test_vendored_table_is_small_and_knows_server_parts() -> None:
    assert cpu_idle.TDP_TABLE.stat().st_size < 150_000
    table = cpu_idle.load_tdp_table()
    assert len(table) > 4000
    assert cpu_idle.lookup_tdp("AMD EPYC 9454 48-Core Processor") == ("AMD EPYC 9454", 290.0)
    assert cpu_idle.lookup_tdp("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz") == (
        "Intel Xeon Gold 6338",
        205.0,
    )
    # matched by its words: every word of the table's name is in the machine's
    assert cpu_idle.lookup_tdp("13th Gen Intel(R) Core(TM) i9-13900K") == (
        "Intel Core i9-13900K",
        125.0,
    )
    assert cpu_idle.lookup_tdp("AMD EPYC") is None  # a virtual machine's bare vendor name
    assert cpu_idle.lookup_tdp("") is None


def test_word_match_needs_three_words_and_one_tdp() -> None:
    table = {
        cpu_idle.normalize_cpu_name(name): (name, tdp)
        for name, tdp in [("3280", 65.0), ("Acme X 100", 50.0), ("Acme X 100 Pro", 80.0)]
    }
    assert cpu_idle.lookup_tdp("Acme X 100 Pro 8-Core Processor", table) == ("Acme X 100 Pro", 80.0)
    assert cpu_idle.lookup_tdp("Acme 3280", table) is None  # "3280" alone is too short
    table["acme x 100 max"] = ("Acme X 100 Max", 90.0)
    assert cpu_idle.lookup_tdp("Acme X 100 Pro Max", table) is None  # two 4-word names: ambiguous


def test_unreadable_table_is_empty(tmp_path: Path) -> None:
    assert cpu_idle.load_tdp_table(tmp_path / "missing.csv") == {}
    bad = tmp_path / "bad.csv"
    bad.write_text("Name,TDP\nAcme One,27.29.5\nAcme Two,40\n")
    assert cpu_idle.load_tdp_table(bad) == {"acme two": ("Acme Two", 40.0)}


def test_read_cpuinfo_counts_sockets_and_physical_cores() -> None:
    info = cpu_idle.read_cpuinfo(TWO_SOCKETS)
    assert info == CPUInfo("Intel(R) Xeon(R) Platinum 8480+", sockets=2, physical_cores=4)
    bare = cpu_idle.read_cpuinfo("processor\t: 0\n")  # no model name, ids (some ARM kernels)
    assert bare.model_name == "" and bare.sockets == 1 and bare.physical_cores >= 1


def test_estimate_from_tdp_table_per_socket() -> None:
    estimate = cpu_idle.estimate_idle_w(info=cpu_idle.read_cpuinfo(TWO_SOCKETS))
    assert estimate.idle_w == pytest.approx(cpu_idle.IDLE_SHARE_OF_TDP * 350.0 * 2)
    assert estimate.source == "tdp-table: Intel Xeon Platinum 8480+ (350 W TDP) x 0.25 x 2 sockets"
    one = cpu_idle.estimate_idle_w(info=CPUInfo("AMD EPYC 9454 48-Core Processor", 1, 48))
    assert one == IdleEstimate(72.5, "tdp-table: AMD EPYC 9454 (290 W TDP) x 0.25 x 1 socket")


def test_unknown_cpu_takes_the_labelled_per_core_fallback() -> None:
    estimate = cpu_idle.estimate_idle_w(info=CPUInfo("AMD EPYC", 1, 2))
    assert estimate.idle_w == pytest.approx(cpu_idle.FALLBACK_IDLE_W_PER_CORE * 2)
    assert estimate.source == (
        "fallback: 1.5 W x 2 physical cores (CPU 'AMD EPYC' not in the TDP table)"
    )


def test_explicit_idle_watts_win_over_the_table() -> None:
    info = CPUInfo("AMD EPYC 9454 48-Core Processor", 1, 48)
    assert cpu_idle.estimate_idle_w(40.0, info) == IdleEstimate(40.0, "explicit: cpu_idle_w=40 W")
    assert cpu_idle.estimate_idle_w(0.0, info).idle_w == 0.0  # the busy-only model


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "50", True])
def test_config_rejects_bad_idle_watts(bad: object) -> None:
    problems = TrainConfig(cpu_idle_w=bad).problems()  # type: ignore[arg-type]
    assert problems == [
        f"cpu_idle_w={bad!r}: allowed a number of watts >= 0 (the CPU packages' idle power), "
        "or unset to take it from the CPU's TDP"
    ]
    with pytest.raises(ConfigError, match=r"cpu_idle_w=.*allowed a number of watts >= 0"):
        TrainConfig.from_dict({"cpu_idle_w": bad})


def test_config_accepts_unset_zero_and_watts() -> None:
    for ok in (None, 0, 52.5):
        assert TrainConfig(cpu_idle_w=ok).problems() == []
    assert TrainConfig.from_dict({"cpu_idle_w": 52.5}).cpu_idle_w == 52.5
    assert TrainConfig().to_dict()["cpu_idle_w"] is None
