"""``runtime.probe_child``: the probes' child watched as it runs, its mark acted on while it
goes on; a real child process (a short Python script) stands in for the probes."""

from __future__ import annotations

import os
import sys

from runtime.probe_child import GPU_LEARNER_MARK, run_child


def _child(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_the_mark_is_acted_on_while_the_child_goes_on_and_its_output_is_kept(tmp_path):
    flag = tmp_path / "started"
    # the child waits for what the caller starts at the mark: it could not end otherwise
    body = (
        "import sys, time, os\n"
        f"print({GPU_LEARNER_MARK!r}, file=sys.stderr, flush=True)\n"
        "print('a warning', file=sys.stderr, flush=True)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
        "print('{\"done\": 1}')\n"
    )
    calls = []
    ran = run_child(_child(body), dict(os.environ), 120.0, lambda: calls.append(flag.touch()))
    assert ran == (0, '{"done": 1}\n', ["a warning"]) and len(calls) == 1


def test_a_child_past_its_time_is_killed_and_a_failing_callback_leaves_it_running(tmp_path):
    assert run_child(_child("import time; time.sleep(60)"), dict(os.environ), 0.5) is None
    body = f"import sys; print({GPU_LEARNER_MARK!r}, file=sys.stderr); print('ok')"

    def broken() -> None:
        raise OSError("no room for the spare")

    code, out, err = run_child(_child(body), dict(os.environ), 120.0, broken)
    assert (code, out, err) == (0, "ok\n", [])  # its failure is logged; the probes go on
    code, _, err = run_child(_child("import sys; sys.exit('bad env')"), dict(os.environ), 120.0)
    assert code == 1 and err == ["bad env"]  # no mark: nothing is called, the error is kept


def test_a_failed_childs_message_is_the_exception_it_ended_with_not_the_hint_after_it():
    from runtime.probe_child import failure_line

    cuda = [
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in <module>',
        "torch.AcceleratorError: CUDA error: out of memory",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "",
    ]
    assert failure_line(cuda, 1) == (
        "torch.AcceleratorError: CUDA error: out of memory (its last line: Compile with "
        "`TORCH_USE_CUDA_DSA` to enable device-side assertions.)"
    )
    ended = ["Traceback (most recent call last):", "gymnasium.error.NameNotFound: NoSuchEnv"]
    assert failure_line(ended, 1) == "gymnasium.error.NameNotFound: NoSuchEnv"
    assert failure_line(["bad env"], 1) == "bad env"  # sys.exit's message: no exception line
    assert failure_line(["", "  "], -9) == "probe process exited -9"
