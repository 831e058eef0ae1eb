"""What ``--cluster`` names: a running Ray cluster, or a local one started for the run.

auto              the Ray cluster this machine belongs to (``ray start`` ran here, or
                  ``RAY_ADDRESS`` is set)
ray://HOST:PORT   a Ray cluster's client server (``ray start --head`` opens one on 10001)
local:N           a local Ray cluster of N nodes started for the run and stopped after it
                  (tests and single-box use); each node gets an equal part of the cores
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALLOWED = "auto, ray://HOST:PORT or local:N (N nodes, 1 to 64)"
LOCAL_NODES_MAX = 64
_RAY = re.compile(r"^ray://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed ``--cluster`` value: ``kind`` is ``auto``, ``ray`` or ``local``."""

    kind: str
    target: str = ""
    """``ray://HOST:PORT`` for ``ray``; empty otherwise."""
    nodes: int = 0
    """For ``local``: how many nodes to start."""

    def __str__(self) -> str:
        return {"auto": "auto", "ray": self.target, "local": f"local:{self.nodes}"}[self.kind]


def parse_cluster(text: object) -> ClusterAddress:
    """Parses a ``--cluster`` value.

    Raises:
        ValueError: ``text`` is none of the allowed forms (the message says which are).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"cluster={text!r}: allowed {ALLOWED}")
    text = text.strip()
    if text == "auto":
        return ClusterAddress("auto")
    if text.startswith("local:"):
        count = text[len("local:") :]
        if count.isdigit() and 1 <= int(count) <= LOCAL_NODES_MAX:
            return ClusterAddress("local", nodes=int(count))
        raise ValueError(f"cluster={text!r}: local:N needs N from 1 to {LOCAL_NODES_MAX}")
    m = _RAY.match(text)
    if m and 1 <= int(m.group(2)) <= 65535:
        return ClusterAddress("ray", target=text)
    raise ValueError(f"cluster={text!r}: allowed {ALLOWED}")
