"""The wrap copies a script's output through whatever our stdout is."""

from __future__ import annotations

import contextlib
import io
import os
import threading

from autotune.wrap.measure import Tee


def test_a_scripts_output_is_copied_and_drained_where_stdout_has_no_byte_buffer():
    """Under ``contextlib.redirect_stdout`` (or a notebook), stdout has no ``buffer``: the
    lines are written as text and the pipe is read to its end, so a script that prints more
    than a pipe holds is never blocked."""
    read, write = os.pipe()
    lines = [f"line {i} {'x' * 90}\n".encode() for i in range(4000)]  # about 400 KB

    def script() -> None:
        with os.fdopen(write, "wb") as out:
            for line in lines:
                out.write(line)

    captured = io.StringIO()
    writer = threading.Thread(target=script)
    with contextlib.redirect_stdout(captured):
        writer.start()
        tee = Tee(os.fdopen(read, "rb"))
        writer.join(timeout=120)
        tee.join()
    assert not writer.is_alive()  # the pipe was drained: the writer was never stuck on it
    assert captured.getvalue() == b"".join(lines).decode()
    assert tee.first_line_at is not None
