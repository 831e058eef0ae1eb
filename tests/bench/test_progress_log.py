"""Progress curves: the lines every learning run writes and every benchmark reads."""

from __future__ import annotations

import json

import pytest

from autotune.workflows.progress_log import ProgressLog, read_progress, value_at_steps


def test_lines_rate_limited_unless_forced(tmp_path):
    path = tmp_path / "p.jsonl"
    with ProgressLog(path, every_s=60.0) as log:
        assert log.write(0, None, 0)
        assert not log.write(100, 1.0, 1)  # within every_s
        assert log.write(200, float("nan"), 2, force=True)
    rows = read_progress(path)
    assert [r["steps"] for r in rows] == [0, 200]
    assert rows[1]["return"] is None and rows[1]["episodes"] == 2


def test_unchanged_steps_not_repeated(tmp_path):
    with ProgressLog(tmp_path / "p.jsonl", every_s=0.0) as log:
        assert log.write(5, 1.0)
        assert not log.write(5, 2.0)


def test_cut_last_line_dropped_other_bad_lines_named(tmp_path):
    path = tmp_path / "p.jsonl"
    good = json.dumps({"t": 1.0, "steps": 10, "return": 3.0, "episodes": 1})
    path.write_text(good + "\n" + '{"t": 2.0, "ste')
    assert [r["steps"] for r in read_progress(path)] == [10]
    path.write_text('{"t": 1.0}\n' + good + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:1: malformed progress line"):
        read_progress(path)


def test_append_goes_on_after_a_cut_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"t": 1.0, "steps": 10, "return": None}) + "\n" + '{"t": 2')
    with ProgressLog(path, every_s=0.0, append=True) as log:
        log.write(20, 4.0)
    assert [r["steps"] for r in read_progress(path)] == [10, 20]
    ProgressLog(path).close()  # without append: a fresh curve
    assert read_progress(path) == []


def test_value_at_steps_takes_the_first_line_with_a_value():
    rows = [
        {"t": 0, "steps": 0, "return": None},
        {"t": 1, "steps": 100, "return": None},
        {"t": 2, "steps": 150, "return": 7.0},
        {"t": 3, "steps": 300, "return": 9.0},
    ]
    assert value_at_steps(rows, 100) == 7.0
    assert value_at_steps(rows, 300) == 9.0
    assert value_at_steps(rows, 301) is None


def test_bad_rate_refused(tmp_path):
    with pytest.raises(ValueError, match="every_s"):
        ProgressLog(tmp_path / "p.jsonl", every_s=-1)
