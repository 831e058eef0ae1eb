"""The sharing suite's pieces that need no GPU: job specs and the sequential way joined from
its per-job parts."""

import pytest

from bench.shared_machine import joined, parse_jobs


def test_parse_jobs_names_and_refuses():
    specs = parse_jobs("ant@0+120, humanoid@30+90", {"ant": ("Ant-v5", "auto")})
    assert [(s.name, s.env, s.start_s, s.seconds) for s in specs] == [
        ("ant-0", "Ant-v5", 0.0, 120.0),
        ("humanoid-1", "humanoid", 30.0, 90.0),
    ]
    with pytest.raises(ValueError, match="WORKLOAD@START"):
        parse_jobs("ant@-1+5", {})
    with pytest.raises(ValueError, match="no jobs"):
        parse_jobs(" , ", {})


def _part(name, seconds, steps, gpu_j, cpu_j, idle_j):
    job = {"started_s": 1.0, "steps": steps, "progress": [{"t": 2.0, "steps": steps}]}
    return {
        "seconds": seconds,
        "steps": steps,
        "lost_steps": 0,
        "gpu_j": gpu_j,
        "cpu_j": cpu_j,
        "idle_j": idle_j,
        "jobs": {name: job},
    }


def test_joined_adds_spans_steps_and_joules():
    out = joined(
        [_part("a", 100.0, 1000, 300.0, 200.0, 100.0), _part("b", 50.0, 500, 150.0, 100.0, 50.0)]
    )
    assert out["seconds"] == 150.0 and out["steps"] == 1500
    assert out["steps_per_joule"] == pytest.approx(1500 / 750)
    assert out["steps_per_joule_busy_only"] == pytest.approx(1500 / 600)
    assert out["steps_per_s"] == pytest.approx(10.0)
    assert out["jobs"]["b"]["started_s"] == 101.0
    assert out["jobs"]["b"]["progress"][0]["t"] == 102.0
    rapl = [{**_part("a", 100.0, 1000, 300.0, 200.0, 100.0), "cpu": "rapl"}]
    assert joined(rapl)["steps_per_joule_busy_only"] is None  # RAPL has no idle part


def test_each_way_is_read_against_the_limits_beside_it():
    from bench.sharing_report import limits_beside, of_limit

    results = {
        "limit:together": {"steps_per_joule": 200.0},
        "together": {"steps_per_joule": 100.0},
        "limit:daemon": {"steps_per_joule": 180.0},
        "daemon": {"steps_per_joule": 90.0},
        "limit-end": {"steps_per_joule": 120.0},
    }
    ways = ["together", "daemon"]
    assert limits_beside(results, ways) == {"together": [200.0, 180.0], "daemon": [180.0, 120.0]}
    frac = of_limit(results, ways)
    assert frac["together"] == pytest.approx(100 / 190)
    assert frac["daemon"] == pytest.approx(90 / 150)


def test_the_floor_line_compares_each_job_under_the_daemon_with_the_same_job_together():
    from bench.sharing_report import floor_line

    def way(**rates):
        return {"jobs": {n: {"steps_per_s": r} for n, r in rates.items()}}

    met = floor_line({"daemon": way(a=90.0, b=100.0), "together": way(a=100.0, b=100.0)})
    assert "a 0.90, b 1.00" in met and met.endswith(": met")
    low = floor_line({"daemon": way(a=70.0, b=100.0), "together": way(a=100.0, b=100.0)})
    assert low.endswith("NOT met")
    assert "not measured" in floor_line({"daemon": way(a=1.0)})


def test_the_tables_go_to_markdown_as_printed(tmp_path, capsys):
    """The suite's finish on a stored H200 run: what it prints is what ``--markdown`` keeps."""
    import argparse
    import json
    from pathlib import Path

    from bench.suites import sharing

    stored = Path(__file__).parents[2] / "docs/results/sharing/h200-three-ways/sharing.json"
    results = json.loads(stored.read_text())["results"]
    ap = argparse.ArgumentParser()
    sharing.add_args(ap)
    ways = "sequential,together,daemon"
    a = ap.parse_args(["--ways", ways, "--markdown", str(tmp_path / "t.md")])
    a.out = str(tmp_path)
    sharing.check(ap, a)
    _, finish = sharing.plan(a)
    finish(results)
    text = (tmp_path / "t.md").read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "1.17 (goal >= 1.3)" in text
    assert "daemon / sequential steps/J: 1.21 (goal >= 0.9): met" in text
    assert "at most 1.22 at this way's start-ups" in text  # the 1.3x goal is past its ceiling
    assert "| daemon | 3 | 236 | 189 | 7,201,792 |" in text


def test_a_ways_ceiling_counts_the_time_any_job_trained_at_the_limits_rate():
    """Overlapping jobs count their shared seconds once, a gap in which no job trains not at
    all; the rate is the mean of the limits beside the way, the joules the way's own."""
    from bench.sharing_report import ceilings, trained_s

    def job(start, first, end):
        return {"started_s": start, "first_trained_s": first, "progress": [{"t": end}]}

    way = {
        "gpu_j": 600.0,
        "cpu_j": 400.0,
        "jobs": {"a": job(0, 10, 50), "b": job(20, 5, 60), "c": job(70, 10, 100)},
    }
    assert trained_s(way) == pytest.approx(50 + 20)  # 10-60 and 80-100
    waiting = {"jobs": {"d": {**job(0, None, 9), "first_trained_s": None}}}
    assert trained_s(waiting) == 0.0
    results = {
        "limit:daemon": {"steps_per_s": 100.0},
        "daemon": way,
        "limit-end": {"steps_per_s": 300.0},
    }
    assert ceilings(results, ["daemon"]) == {"daemon": pytest.approx(200.0 * 70 / 1000)}
    assert ceilings({"daemon": way}, ["daemon"]) == {}  # no limit beside it: no ceiling


def test_each_jobs_start_up_is_read_from_its_result_and_progress(tmp_path):
    """A way's figures name each job's start-up, as its result and progress file say: how long
    it probed (nothing when its probes came from the cache) and when it trained its first
    batch, from its own start; the machine's meter spans them (the CPU model here)."""
    import json
    import time

    from bench.machine_meter import MachineMeter
    from bench.shared_machine import _figures

    specs = parse_jobs("ant@0+1,ant@0+1", {"ant": ("Ant-v5", "auto")})
    meter = MachineMeter(0.02).start()
    t0 = time.time()
    for spec, cached in zip(specs, (False, True), strict=True):
        probes = {"cached": cached, "probe_s": 23.5, "gpu_busy_pct": 0.0}
        result = {"env_steps": 1024, "sampled_steps": 1024, "discarded_steps": 0}
        result.update(lost_steps=0, wall_s=1.0, steps_per_s=1024.0, sizing={"probes": probes})
        (tmp_path / f"{spec.name}.result.json").write_text(json.dumps(result))
        rows = [{"t": t0 + 0.01, "steps": 0}, {"t": t0 + 0.05, "steps": 1024}]
        progress = "\n".join(json.dumps(r) for r in rows) + "\n"
        (tmp_path / f"{spec.name}.progress.jsonl").write_text(progress)
    time.sleep(0.2)
    meter.stop()
    started = {spec.name: t0 for spec in specs}
    out = _figures(specs, "together", tmp_path, meter, t0, started, [])
    probed, read = (out["jobs"][s.name] for s in specs)
    assert probed["probe_s"] == 23.5 and read["probe_s"] is None  # read from the cache
    assert probed["first_trained_s"] == pytest.approx(0.05) and probed["invariant"]
    assert out["steps"] == 2048 and out["cpu_j"] > 0
