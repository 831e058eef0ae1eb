"""The runner's service processes: the compressor, the migrator, the trainer GMIs and, with
``inference='gmi'``, the inference GMI. Started by name, watched every tick (during the run by
``runtime.supervisor``, which replaces the ones it can; during the drain one that dies before
its final report ends the run), told to exit once the drain is done, and killed when a run is
abandoned."""

from __future__ import annotations

import time
from collections.abc import Callable, ItemsView, ValuesView
from typing import Any

from runtime import commands
from runtime.cache_dirs import use_bytecode_cache
from runtime.child_start import ctrl_c_held

PIPELINE = ("compressor", "migrator")
"""The stages that run as service processes of their own (each actor's dispenser runs in the
actor, each trainer's batcher in its GMI)."""


class RunError(RuntimeError):
    """A service process died or a drain did not complete; ``killed`` when a signal ended it
    (something outside the run, not the run's own fault)."""

    def __init__(self, message: str, killed: bool = False) -> None:
        super().__init__(message)
        self.killed = killed


class Services:
    """The service processes of one run, by name (``spawn`` context ``ctx``). Its processes
    and the actors, all started after it, keep their imports' bytecode in the tool's cache
    where the install has none (``runtime.cache_dirs.use_bytecode_cache``)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        use_bytecode_cache()
        self.procs: dict[str, Any] = {}

    def spawn(self, name: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        proc = self.ctx.Process(target=target, args=args, name=name, daemon=True)
        with ctrl_c_held():
            proc.start()
        self.procs[name] = proc

    def adopt(self, name: str, proc: Any) -> None:
        """Watches ``proc``, started elsewhere (a spare GMI given its role), as ``name``."""
        self.procs[name] = proc

    def stop(self, name: str) -> None:
        """Kills ``name`` if it still runs and forgets it (a process being replaced)."""
        proc = self.procs.pop(name)
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)

    def __contains__(self, name: object) -> bool:
        return name in self.procs

    def items(self) -> ItemsView[str, Any]:
        return self.procs.items()

    def values(self) -> ValuesView[Any]:
        return self.procs.values()

    def all_alive(self) -> bool:
        return all(p.is_alive() for p in self.procs.values())

    def check(self, is_final: Callable[[str], bool]) -> None:
        """Raises ``RunError`` for a service that exited before its final report."""
        for name, proc in self.procs.items():
            if not proc.is_alive() and not is_final(name):
                raise RunError(
                    f"{name} process died (exit code {proc.exitcode})",
                    killed=proc.exitcode is not None and proc.exitcode < 0,
                )

    def exit_all(self, command_sock: commands.CommandOut, deadline: float) -> None:
        """Tells every service to exit (resent: PUB/SUB) until all have, or ``deadline``."""
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
            command_sock.send({"cmd": "exit"})
            for proc in self.procs.values():
                proc.join(timeout=0.1)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.procs.values():
            proc.join(timeout=5)
