"""How every benchmark script hands back its result document."""

from __future__ import annotations

import json


def emit(doc: dict, out: str | None) -> None:
    """Prints the document as JSON and, with ``out``, writes it there too."""
    text = json.dumps(doc, indent=2)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
