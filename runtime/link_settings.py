"""Checks of a run's link settings: ``transport``, ``bind_host`` and ``cluster``
(``runtime.config.TrainConfig`` calls them; kept apart so the config stays readable)."""

from __future__ import annotations

import ipaddress
from typing import Any


def _ip_address(host: object) -> bool:
    if not isinstance(host, str):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def link_problems(cfg: Any) -> list[str]:
    """Every invalid link setting of ``cfg`` that can be judged without touching the machine."""
    out = []
    if cfg.transport not in ("ipc", "tcp"):
        out.append(f"transport={cfg.transport!r}: allowed 'ipc' or 'tcp'")
    if not _ip_address(cfg.bind_host):
        out.append(
            f"bind_host={cfg.bind_host!r}: must be an IP address of this machine, e.g. "
            "127.0.0.1 (0.0.0.0 or :: for every interface)"
        )
    if cfg.cluster is not None:
        from runtime.cluster.address import parse_cluster

        try:
            parse_cluster(cfg.cluster)
        except ValueError as exc:
            out.append(str(exc))
        if cfg.transport != "tcp":
            out.append(
                f"cluster={cfg.cluster!r} with transport={cfg.transport!r}: actors on other "
                "nodes reach the run over tcp only (transport 'tcp', which --cluster sets)"
            )
    return out


def link_check(cfg: Any) -> str | None:
    """Why ``cfg``'s links cannot be served here (no CURVE, a bind host this machine lacks,
    no Ray for ``cluster``), or None."""
    if cfg.transport == "tcp":
        from runtime.topology import tcp_problem

        if why := tcp_problem(cfg.bind_host):
            return why
    if cfg.cluster is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            return (
                f"cluster={cfg.cluster!r} needs Ray, which is not installed here: "
                "pip install 'rl-autotune[cluster]'"
            )
    return None
