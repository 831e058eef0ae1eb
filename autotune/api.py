"""The Python API: what ``autotune train``, ``train --tune``, ``study`` and ``export`` do, called
from a script. Options are frozen dataclasses (``TrainConfig``, ``TuneOptions``,
``StudyOptions``); every function returns the document the matching command's ``--json``
writes.

    import autotune

    if __name__ == "__main__":       # the actors are new processes that import this script
        run = autotune.train(autotune.TrainConfig(env="CartPole-v1", steps=50_000))
        tuned = autotune.tune(
            autotune.TrainConfig(env="CartPole-v1", steps=200_000, max_wall_s=120),
            autotune.TuneOptions(study="cartpole-online"),
        )
        found = autotune.study(autotune.StudyOptions(env="CartPole-v1", trials=6, trial_s=20))
        best = autotune.export("study-CartPole-v1")

``train`` and ``tune`` run the config as given (the CLI's ``auto`` sizing is the CLI's); a
config is checked against its env before any process starts. Called at the top level of a
script, with no ``if __name__ == "__main__":`` guard, they raise ``MainGuardError`` at once:
each process they start would import the script and run it again.
"""

from __future__ import annotations

import ast
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config import TrainConfig


class MainGuardError(RuntimeError):
    """The API was called where the processes it starts would call it again."""


def _check_main_guard(api: str) -> None:
    """Raises ``MainGuardError`` when called (through ``api``) from the top level of a script
    file run as ``__main__`` outside an ``if __name__ == "__main__":`` block, or while a spawned
    child re-imports that script (``__mp_main__``)."""
    frame = inspect.currentframe()
    while frame is not None:
        at_top = frame.f_code.co_name == "<module>"
        name = frame.f_globals.get("__name__")
        script = frame.f_globals.get("__file__")  # the frame's own, whatever launched it
        if at_top and name == "__mp_main__":
            raise MainGuardError(_guard_message(api, script))
        if at_top and name == "__main__" and _is_file_of(frame, script):
            # the innermost script run as __main__ (under pdb, cProfile or trace too, whose
            # own frames further out are not the user's; a notebook's cells have no file)
            if not _guarded(script, frame.f_lineno):
                raise MainGuardError(_guard_message(api, script))
            return
        frame = frame.f_back


def _is_file_of(frame: Any, script: object) -> bool:
    """Whether ``frame`` runs the code of the file ``script`` names."""
    return isinstance(script, str) and os.path.abspath(frame.f_code.co_filename) == (
        os.path.abspath(script)
    )


def _guard_message(api: str, script: str | None) -> str:
    return (
        f"autotune.{api}() was called at the top level of {script or 'the script'}: the actor "
        "and trainer processes it starts import the script again and would call it again. "
        'Put the call under  if __name__ == "__main__":'
    )


def _guarded(path: str, line: int) -> bool:
    """Whether ``line`` of the script at ``path`` lies in an ``if __name__ == "__main__":``
    block (True where the source cannot be read: nothing to say then)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            first, last = node.body[0].lineno, node.body[-1].end_lineno or node.lineno
            if first <= line <= last:
                return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return isinstance(test.ops[0], ast.Eq) and len(names) == 1 and len(mains) == 1


def _expect(value: Any, kind: type, what: str, example: str) -> None:
    """Raises TypeError, saying what was given and what is allowed, where ``value`` is not a
    ``kind``."""
    if not isinstance(value, kind):
        raise TypeError(
            f"{what} must be an autotune.{kind.__name__}, not "
            f"{type(value).__name__} {value!r:.60}; e.g. {example}"
        )


def train(config: TrainConfig, on_progress: Callable[[Any], None] | None = None) -> dict:
    """Trains ``config`` and returns the result document (``autotune train --json``).

    Raises:
        MainGuardError: called without a main guard (see the module docstring).
        TypeError: ``config`` is not a ``TrainConfig``.
        runtime.config.ConfigError: a setting the env or the machine does not allow.
        runtime.runner.RunError: the run failed; its ``result`` holds what it had done. Any
            other error that ends a run under way (a full disk, say) carries ``result`` too.
    """
    _check_main_guard("train")
    from runtime.runner import Runner

    _expect(config, TrainConfig, "train()'s config", "TrainConfig(env='CartPole-v1')")
    info = config.validate()
    return Runner(config, info, on_progress=on_progress).run()


def tune(
    config: TrainConfig,
    options: Any = None,
    on_progress: Callable[[Any], None] | None = None,
) -> dict:
    """Trains ``config`` while the online tuner changes its knobs (``autotune train --tune``);
    the result's ``tuning`` section holds the trials and the best config.

    Args:
        options: ``TuneOptions`` (None: the defaults, tuned in this process).

    Raises:
        MainGuardError, TypeError, ConfigError, RunError: as ``train`` (TypeError also for
            ``options`` that are not ``TuneOptions``).
        ValueError: a bad knob, study or tuner setting; nothing has started then.
    """
    _check_main_guard("tune")
    from autotune.workflows.tune import TuneOptions, start_tuning
    from runtime.hw.gpus import no_gpu_reason
    from runtime.runner import Runner

    _expect(config, TrainConfig, "tune()'s config", "TrainConfig(env='CartPole-v1')")
    options = options or TuneOptions(in_process=True)
    _expect(options, TuneOptions, "tune()'s options", "TuneOptions(in_process=True)")
    info = config.validate()
    # a tuner may move the trainer to a GPU share: MPS from the start where there is a GPU
    gpu_here = config.resolved_device() == "cuda" or no_gpu_reason() is None
    runner = Runner(config, info, mps_live=gpu_here)
    tuning = start_tuning(options, runner.cfg, runner)

    def progress(state: Any) -> None:
        if on_progress is not None:
            on_progress(state)
        if not state.draining:
            tuning.tick()

    runner.on_progress = progress
    try:
        result = runner.run()
    finally:
        doc = tuning.finish()
    result["tuning"] = {**(doc or {}), "where": tuning.where}
    return result


def study(options: Any) -> dict:
    """Runs an offline study (``autotune study``), here or, as ``workers`` and ``cluster``
    say, in worker processes or on a cluster's nodes, and returns what ``--json`` writes: the
    study, objective, each trial's row, the best trial and the Pareto front.

    Args:
        options: ``StudyOptions``.

    Raises:
        MainGuardError: as ``train``.
        TypeError: ``options`` are not ``StudyOptions``.
        ValueError: bad options (``KnobError``, ``ConfigError``, ``StudyError``), or a cluster
            that cannot be reached or is too small for the workers.
        KeyboardInterrupt: Ctrl-C cut the trials (the study keeps what was measured).
    """
    _check_main_guard("study")
    from autotune.workflows.study import StudyOptions, resolve_options, summary
    from autotune.workflows.study_run import prepare, run_trials

    _expect(options, StudyOptions, "study()'s options", "StudyOptions(env='CartPole-v1')")
    options = resolve_options(options)
    offline, plan = prepare(options)
    rows: list[dict] = []
    if run_trials(options, offline, plan, rows.append, say=lambda text: None):
        raise KeyboardInterrupt(f"study {offline.study.study_name!r}: its trials were cut")
    return {
        "study": offline.study.study_name,
        "objective": options.objective,
        "trials": rows,
        **summary(offline.study, options.objective),
    }


def export(
    study_name: str, storage: str = "sqlite:///autotune.db", pick: str | None = None
) -> dict:
    """The export document of a study (``autotune export``): a training study's recommended
    config and sizing, or a wrap study's best knob values and filled-in command.

    Raises:
        ExportError, StudyError: the study cannot be read or holds nothing to export.
    """
    from autotune.tuning.storage import load_study
    from autotune.workflows.export import export_doc
    from autotune.workflows.wrap_export import is_wrap_study, wrap_export_doc

    found = load_study(storage, study_name)
    return wrap_export_doc(found, pick) if is_wrap_study(found) else export_doc(found, pick)
