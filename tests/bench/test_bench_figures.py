"""``python -m bench figures``: draws the page's plots from the stored results, no GPU needed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import figures

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
PNG = b"\x89PNG\r\n\x1a\n"


def test_figures_command_writes_pngs_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    for sub in ("end-to-end", "cuda-context", "wrap-guide", "goodput/to-390-h200"):
        shutil.copytree(RESULTS / sub, tmp_path / sub, ignore=shutil.ignore_patterns("*.png"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "figures",
            "--results",
            str(tmp_path),
            "--only",
            "end-to-end,cuda-context,wrap,to-sb3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for path in (
        tmp_path / "end-to-end" / "ant-e2e.png",
        tmp_path / "cuda-context" / "gpu-idle-power.png",
        tmp_path / "wrap-guide" / "wrap-guide.png",
        tmp_path / "goodput" / "to-390-h200" / "return-vs-joules.png",
    ):
        data = path.read_bytes()
        assert data.startswith(PNG), path
        assert 1_000 < len(data) < 60_000, (path, len(data))


def test_figures_refuses_an_unknown_name(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "figures", "--results", str(tmp_path), "--only", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown figure(s) nope" in proc.stderr
    assert ", ".join(figures.FIGURES) in proc.stderr
