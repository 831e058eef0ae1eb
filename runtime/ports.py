"""The TCP ports of a run's links: chosen when the run starts, held until it ends.

A link's port is bound by the process that serves it, later than the run chooses it (and again
by a replacement). Meanwhile another process must not take it: each is held by a socket of the
runner's, bound without SO_REUSEADDR (so a port anyone holds is refused) and then given it, not
listening; the run's processes bind there (ZeroMQ sets SO_REUSEADDR). A process that binds
without SO_REUSEADDR (most servers, and the kernel's choice of a port for a client) is refused
it; one that sets SO_REUSEADDR, as ZeroMQ does, may still bind it, and a run whose link then
cannot bind fails with that error and gives its ports back.
"""

from __future__ import annotations

import errno
import random
import socket as pysocket

PORTS_FROM = 20_000
"""The lowest port a run's link takes: Ray hands its workers 10002-19999 by default."""
_HELD: dict[int, pysocket.socket] = {}
"""Ports chosen for this process's runs, each held by a bound socket (not listening; its
SO_REUSEADDR set after the bind) until ``release``: the run's own processes bind there (ZeroMQ
sets SO_REUSEADDR), and a process binding without SO_REUSEADDR cannot take one meanwhile (Ray
starts dozens of sockets between a run's choice of ports and its migrator's bind; in CI one
took the migrator's)."""


def _ephemeral_from() -> int:
    """Where the kernel's ephemeral ports start (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str, hold: bool = True) -> int:
    """A port free on ``host``, held for the run (``_HELD``) unless ``hold`` is False; taken
    between Ray's worker ports and the ephemeral range where there is room."""
    family = pysocket.AF_INET6 if ":" in host else pysocket.AF_INET
    lo, rng = _ephemeral_from(), random.SystemRandom()
    tries = [rng.randrange(PORTS_FROM, lo) for _ in range(32)] if lo - PORTS_FROM >= 1000 else []
    for port in [*tries, 0]:  # the kernel's choice where none of ours is free
        s = pysocket.socket(family)
        try:
            s.bind((host, port))  # without SO_REUSEADDR: refused where anyone holds it
        except OSError as exc:
            s.close()
            if exc.errno != errno.EADDRINUSE or not port:
                raise ValueError(
                    f"bind host {host!r}: cannot bind it here ({exc.strerror}); give an "
                    "address of this machine, e.g. 127.0.0.1 or the address of an "
                    "interface other hosts reach"
                ) from None
            continue
        break  # bound: port 0 always binds or raises, so the loop ends here
    port = int(s.getsockname()[1])
    if hold:
        s.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_REUSEADDR, 1)
        _HELD[port] = s
    else:
        s.close()
    return port


def release(addresses: list[str]) -> None:
    """Lets go of the ports held for ``addresses`` (a run's links, at its end)."""
    for address in addresses:
        if address.startswith("tcp://"):
            held = _HELD.pop(int(address.rsplit(":", 1)[1]), None)
            if held is not None:
                held.close()
