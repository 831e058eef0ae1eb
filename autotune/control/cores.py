"""Core sets as the command line and ``autotune status`` write them: ``0-3,8``."""

from __future__ import annotations


def format_cores(cores: tuple[int, ...] | list[int]) -> str:
    """``0-3,8`` for (0, 1, 2, 3, 8)."""
    out: list[str] = []
    for c in sorted(cores):
        if out and c == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out) or "none"


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` as (0, 1, 2, 3, 8).

    Raises:
        ValueError: naming what was given and the form allowed.
    """
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                raise ValueError
            out.extend(range(first, last + 1))
    except ValueError:
        raise ValueError(
            f"cores {text!r}: expected a list such as 0-3,8 (ascending ranges of core numbers)"
        ) from None
    return tuple(sorted(set(out)))
