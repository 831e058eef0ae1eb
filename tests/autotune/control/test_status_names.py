"""Names from users and jobs are shown as they are, and paths they give mean where they were
given."""

from __future__ import annotations

from rich.console import Console

from autotune.cli.status_view import render
from autotune.control.keys import keys_dir


def _job(**extra):
    return {"study": "ant[/v5]", "storage": "sqlite:///x[bold].db", "best": None, **extra}


def test_status_prints_study_and_env_names_as_given():
    console = Console(record=True, width=200)
    rows = [{"number": n, "values": {"actors": 2}, "objective": 1.0} for n in range(3)]
    render(console, _job(trials=rows), history=0)  # a name with markup's brackets: no error
    text = console.export_text()
    assert "study ant[/v5] in sqlite:///x[bold].db" in text
    budget = {"cores": [4, 5, 6, 7], "gpu": None, "mps_pct": None}
    console = Console(record=True, width=200)
    render(console, _job(trials=[], allocation=budget, starting=True), history=0)
    text = console.export_text()  # a job that has not trained: the others keep their cores
    assert "budget: cores 4-7; starting: the running jobs keep their cores" in text


def test_a_relative_keys_folder_means_the_folder_it_was_given_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_KEYS", "rel/keys")
    assert keys_dir() == tmp_path / "rel" / "keys"
