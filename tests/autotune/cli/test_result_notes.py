"""What ``train`` adds to its result, and what it tells the user of a run that trained nothing."""

from __future__ import annotations

from autotune.cli.output import complete_result, untrained_note


def _result(steps=0, failure=None, probes=None, startup=None):
    gmis = [{"name": "trainer-0.g0", **({"startup": startup} if startup else {})}]
    doc = {"env_steps": steps, "failure": failure, "gmis": gmis}
    if probes is not None:
        doc["sizing"] = {"probes": probes}
    return doc


def test_a_run_whose_wall_ran_out_in_its_start_up_says_where_the_time_went():
    # as measured on a 2-GPU H200 host: the probes 42.6 s, the trainer still compiling at 55 s
    doc = _result(probes={"probe_s": 42.6, "cached": False}, startup={"total_s": 21.7})
    note = untrained_note(doc, 55.0)
    assert note.startswith("no step was trained: --max-wall-s 55 ran out during the start-up")
    assert "probes took 43 s" in note and "trainer took 22 s to start" in note
    assert "reads the probes from the cache" in note
    # stopped by the user (Ctrl-C): the wall limit is not blamed
    stopped = untrained_note({**doc, "interrupted": True}, 600.0)
    assert stopped.startswith("no step was trained: the run was stopped during its start-up")
    # no probes (every value given): nothing said of them
    given = untrained_note(_result(startup={"total_s": 6.0}), 3.0)
    assert given == (
        "no step was trained: --max-wall-s 3 ran out during the start-up (the trainer took 6 s "
        "to start). Give the run more time."
    )
    # probes read from the cache cost nothing: not named; a trainer that never reported
    cached = untrained_note(_result(probes={"probe_s": 42.6, "cached": True}), None)
    assert (
        cached
        == "no step was trained: the run ended during its start-up (the trainer was starting)"
    )


def test_a_run_that_trained_or_failed_gets_no_note():
    assert untrained_note(_result(steps=512), 55.0) is None
    assert untrained_note(_result(failure="the trainer died"), 55.0) is None


def test_the_result_takes_the_sizing_and_the_tuning_or_a_note_where_the_daemon_gave_none():
    doc = _result(steps=512)
    complete_result(doc, {"values": {"actors": 2}}, "daemon on ipc:///x", None)
    assert doc["sizing"] == {"values": {"actors": 2}}
    assert (
        doc["tuning"]["where"] == "daemon on ipc:///x" and "did not answer" in doc["tuning"]["note"]
    )
    untuned = _result(steps=512)
    complete_result(untuned, None, None, None)
    assert "sizing" not in untuned and "tuning" not in untuned
    tuned = _result(steps=512)
    complete_result(tuned, None, "in this process", {"trials": []})
    assert tuned["tuning"] == {"trials": [], "where": "in this process"}
