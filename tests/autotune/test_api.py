"""The Python API: ``autotune.train``, ``tune``, ``study`` and ``export`` from a script, and a
script without a main guard refused at once instead of hanging."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import autotune

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys
import autotune
from policies.appo_config import APPOConfig

if __name__ == "__main__":
    cfg = autotune.TrainConfig(env="CartPole-v1", steps=4096, actors=1, batch_size=1024)
    run = autotune.train(cfg)
    tuned = autotune.tune(
        autotune.TrainConfig(env="CartPole-v1", steps=12000, actors=1, batch_size=1024,
                             learner=APPOConfig(minibatches=8)),
        autotune.TuneOptions(
            storage=sys.argv[1], study="api-online", in_process=True, sampler="tpe",
            window_s=1.0, warmup_s=0.5, knobs=("envs_per_actor=4,8",),
        ),
    )
    found = autotune.study(autotune.StudyOptions(
        env="CartPole-v1", trials=1, trial_s=240.0, warmup_s=1.0, storage=sys.argv[1],
        study="api-study", profile=False,
        knobs=("envs_per_actor=4,8", "actors=1", "batch_size=1024", "trainers=1",
               "trainer_threads=1"),
    ))  # a trial ends once its window is measured (10 s at least); trial_s is the longest it
    # may run. One trial: what is checked (a study, its best, its export) needs no more.
    best = autotune.export("api-study", storage=sys.argv[1])
    print(json.dumps({
        "trained": run["env_steps"], "tuned": tuned["env_steps"],
        "tuning": sorted(tuned["tuning"]), "study": found["study"],
        "batches": tuned["tuning"]["knobs"]["batch_size"]["choices"],
        "best": found["best"] is not None, "export": best["recommended"]["values"],
        "rows": len(found["trials"]), "objective": found["objective"],
    }))
"""

UNGUARDED = """
import autotune
autotune.train(autotune.TrainConfig(env="CartPole-v1", steps=4096, actors=1))
"""


def test_train_tune_study_and_export_from_a_script(tmp_path):
    script = tmp_path / "use_api.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), f"sqlite:///{tmp_path}/api.db"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["trained"] >= 4096 and doc["tuned"] >= 12000
    assert "trials" in doc["tuning"] and "where" in doc["tuning"]
    # 8 minibatches of at least 128 samples: the tuner tries no batch under 1,024
    assert doc["batches"] == [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    assert doc["study"] == "api-study" and doc["best"]
    assert doc["rows"] == 1 and doc["objective"] == "steps_per_joule"  # as --json has them
    assert doc["export"]["envs_per_actor"] in (4, 8)


def test_a_script_without_a_main_guard_fails_at_once_saying_so(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode != 0
    assert "MainGuardError" in out.stderr and 'if __name__ == "__main__":' in out.stderr
    assert "Traceback" in out.stderr and out.stderr.count("Traceback") == 1  # no child started


GUARDED_BAD_CALL = """
import autotune
if __name__ == "__main__":
    autotune.train("not a config")
"""


@pytest.mark.parametrize("launcher", [[], ["-m", "cProfile"], ["-m", "trace", "--count"]])
def test_the_main_guard_is_found_under_a_profiler_or_tracer_and_its_absence_too(tmp_path, launcher):
    """A profiler, tracer or debugger runs the script as ``__main__`` from its own module: the
    guard is looked for in the script's file, not the launcher's."""
    guarded, unguarded = tmp_path / "guarded.py", tmp_path / "unguarded.py"
    guarded.write_text(GUARDED_BAD_CALL)
    unguarded.write_text('import autotune\nautotune.train("not a config")\n')
    for script, guard in ((guarded, False), (unguarded, True)):
        out = subprocess.run(
            [sys.executable, *launcher, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert ("MainGuardError" in out.stderr) is guard, out.stderr[-2000:]
        assert guard or "TypeError" in out.stderr  # the call itself was reached


def test_the_api_loads_lazily_and_names_what_it_has():
    code = textwrap.dedent(
        """
        import sys, autotune
        assert "optuna" not in sys.modules and "torch" not in sys.modules
        from autotune import client
        assert "optuna" not in sys.modules
        import autotune.cli.main  # every command's start: no torch until a run needs it
        assert "torch" not in sys.modules
        print(autotune.train.__module__, autotune.TuneOptions.__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["autotune.api", "TuneOptions"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        autotune.nope  # noqa: B018


def test_the_wrong_kind_of_argument_is_refused_saying_what_is_allowed():
    import autotune

    for call, given, said in (
        (lambda: autotune.train("CartPole-v1"), "str 'CartPole-v1'", "train()'s config"),
        (lambda: autotune.tune(autotune.TrainConfig(), {"trials": 3}), "dict", "tune()'s options"),
        (lambda: autotune.study({"env": "CartPole-v1"}), "dict", "study()'s options"),
    ):
        with pytest.raises(TypeError) as refused:
            call()
        message = str(refused.value)
        assert said in message and f"not {given}" in message and "e.g. " in message, message
