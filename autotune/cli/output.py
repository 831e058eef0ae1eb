"""What every command writes besides the terminal: its ``--json`` document."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: Path | None, doc: object) -> None:
    """Writes ``doc`` as indented JSON to ``path`` (the ``--json`` flag of every command)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
