"""``python -m bench.handover``: its summary sets hand-overs whose GMI started afresh beside
those whose GMI started from a spare, and bad arguments are refused before any run."""

from __future__ import annotations

import pytest

from bench import handover


def _handover(standby: float, spare: bool) -> dict:
    startup = {"boot_s": 0.0 if spare else 2.0, "torch_import_s": 0.01 if spare else 3.0}
    if spare:
        startup["spare_s"] = 20.0
    startup["total_s"] = sum(v for k, v in startup.items() if k != "spare_s")
    return {"standby_s": standby, "mps_pct": None, "sm_count": None, "startup": startup}


def test_the_summary_sets_afresh_starts_beside_starts_from_a_spare():
    runs = [
        {"arm": "off", "handovers": [_handover(5.0, False), _handover(7.0, False)]},
        {
            "arm": "on",
            "handovers": [_handover(6.0, False), _handover(1.0, True), _handover(2.0, True)],
        },
    ]
    summ = handover.summary(runs)
    assert summ["afresh"]["standby_s"] == [5.0, 7.0, 6.0]
    assert summ["afresh"]["median_standby_s"] == 6.0
    assert summ["from a spare"]["median_standby_s"] == 1.5
    assert summ["from a spare"]["median_stage_s"] == {"boot_s": 0.0, "torch_import_s": 0.01}
    text = handover.table(summ)
    assert "| afresh | 5.0, 7.0, 6.0 | 6.0 | boot 2.0, torch_import 3.0 |" in text
    assert "| from a spare | 1.0, 2.0 | 1.5 |" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arms", "off,maybe"], "each must be one of off, on"),
        (["--handovers", "0"], "must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_a_run(argv, message, capsys):
    with pytest.raises(SystemExit):
        handover.main(argv)
    assert message in capsys.readouterr().err
