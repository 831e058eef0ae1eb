"""``autotune wrap``'s flags out of range are refused before the study is touched, saying what
is allowed."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trial-s", "0"], "--trial-s 0.0: allowed a number of seconds > 0"),
        (["--trial-s", "inf"], "--trial-s inf: allowed a number of seconds > 0"),
        (["--report-timeout-s", "-1"], "--report-timeout-s -1.0: allowed a number of seconds > 0"),
        (["--plots", "p"], "--plots DIR draws the recommendation --export PATH writes"),
        (["--export", "e.json", "--plots", "/proc/version"], "--plots /proc/version: is a file"),
        (["--mode", "live", "--window-s", "-1"], "window_s=-1.0: must be > 0"),
        (["--mode", "live", "--warmup-s", "-2"], "warmup_s=-2.0"),
    ],
)
def test_bad_wrap_flags_are_refused_before_the_study(tmp_path, args, message, capsys):
    from autotune.cli.main import main

    db = tmp_path / "w.db"
    rc = main(["wrap", "--knob", "x=1,2", "--storage", f"sqlite:///{db}", *args, "--", "true"])
    assert rc == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err, err
    assert not db.exists()  # nothing was made
