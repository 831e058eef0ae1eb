"""The CPU packages' idle power that the busy-core model charges per second of wall time.

:func:`estimate_idle_w` returns an :class:`IdleEstimate` (watts and a label saying where they
came from), chosen in this order:

1. ``explicit``: a figure given by the caller (``TrainConfig.cpu_idle_w``) always wins.
2. ``tdp-table``: the CPU's model name from ``/proc/cpuinfo`` is looked up in CodeCarbon's TDP
   table (``data/cpu_power.csv``, MIT licensed, see ``data/README.md``), and the idle power is
   ``IDLE_SHARE_OF_TDP * TDP * sockets``.
3. ``fallback``: a CPU the table does not know is charged ``FALLBACK_IDLE_W_PER_CORE`` per
   physical core.

Every figure here is a model built on assumptions, not a measurement of this machine; RAPL,
where readable, measures the packages whole and needs none of this.
"""

from __future__ import annotations

import csv
import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

TDP_TABLE = Path(__file__).parent / "data" / "cpu_power.csv"
"""CodeCarbon's CPU power table: columns ``Name`` and ``TDP`` (watts)."""

CPUINFO = Path("/proc/cpuinfo")

IDLE_SHARE_OF_TDP = 0.25
"""Idle package power as a share of the package's TDP (an assumption, not a measurement).

Where it comes from: a server package at active idle keeps its uncore, memory controllers and
I/O powered while the cores sit in C-states, and draws roughly a fifth to a third of its TDP;
0.25 sits in that range. Desktop parts with deep package C-states idle lower, so the share
overstates them. Override with ``cpu_idle_w`` where a figure for the machine is known.
"""

FALLBACK_IDLE_W_PER_CORE = 1.5
"""Idle watts per physical core for a CPU the TDP table does not know (an assumption).

Where it comes from: ``IDLE_SHARE_OF_TDP`` applied to current server parts per core, e.g.
0.25 x 290 W / 48 cores (EPYC 9454) = 1.5 W, 0.25 x 350 W / 56 cores (Xeon 8480+) = 1.6 W,
0.25 x 205 W / 32 cores (Xeon Gold 6338) = 1.6 W.
"""

MIN_MATCH_TOKENS = 3
"""A table name matched by its words (not whole) must have at least vendor, family and model."""

_NOISE = re.compile(
    r"\((?:r|tm|c)\)|@\s*[\d.]+\s*[gm]hz|\b\d+-cores?\b|\bprocessor\b|\bcpu\b|\(oem only\)"
)


@dataclass(frozen=True)
class CPUInfo:
    """What the idle model needs to know about the machine's CPUs.

    Attributes:
        model_name: The first ``model name`` of ``/proc/cpuinfo`` ("" where there is none).
        sockets: Physical packages (distinct ``physical id`` values), at least 1.
        physical_cores: Distinct (``physical id``, ``core id``) pairs, at least 1.
    """

    model_name: str
    sockets: int
    physical_cores: int


@dataclass(frozen=True)
class IdleEstimate:
    """Idle package watts and where they came from.

    Attributes:
        idle_w: Watts charged per second of wall time, whatever the load.
        source: A label such as ``tdp-table: AMD EPYC 9454 (290 W TDP) x 0.25 x 1 socket``,
            ``fallback: ...`` or ``explicit: ...``.
    """

    idle_w: float
    source: str


def read_cpuinfo(text: str | None = None) -> CPUInfo:
    """Parses ``/proc/cpuinfo`` (or ``text``): model name, sockets and physical cores.

    Where the file or the fields are missing (not Linux, some ARM kernels), the model name is
    empty, sockets is 1 and physical cores come from psutil.
    """
    if text is None:
        try:
            text = CPUINFO.read_text()
        except OSError:
            text = ""
    model_name = ""
    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    package = core = None
    for line in [*text.splitlines(), ""]:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and not model_name:
            model_name = value
        elif key == "physical id":
            package = value
            packages.add(value)
        elif key == "core id":
            core = value
        elif not key:  # a blank line ends one logical CPU's block
            if package is not None and core is not None:
                cores.add((package, core))
            package = core = None
    physical = len(cores) or psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return CPUInfo(model_name, max(1, len(packages)), physical)


def normalize_cpu_name(name: str) -> str:
    """Lower-case words of a CPU name without marks, clock, core count or filler.

    ``"AMD EPYC 9454 48-Core Processor"`` and ``"Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"``
    become ``"amd epyc 9454"`` and ``"intel xeon gold 6338"``, as the table spells them.
    """
    return " ".join(_NOISE.sub(" ", name.lower()).replace(",", " ").split())


@functools.cache
def load_tdp_table(path: Path = TDP_TABLE) -> dict[str, tuple[str, float]]:
    """The TDP table as ``{normalized name: (name as listed, TDP watts)}``.

    Rows whose TDP is not a positive number are skipped; of names that normalize alike the
    first row wins. A missing or unreadable table gives an empty dict (logged).
    """
    table: dict[str, tuple[str, float]] = {}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                try:
                    tdp_w = float(row["TDP"])
                except (KeyError, TypeError, ValueError):
                    continue
                name = (row.get("Name") or "").strip()
                if name and tdp_w > 0:
                    table.setdefault(normalize_cpu_name(name), (name, tdp_w))
    except OSError as exc:
        logger.warning("CPU TDP table %s unreadable (%s); idle power is per core", path, exc)
    return table


def lookup_tdp(
    model_name: str, table: dict[str, tuple[str, float]] | None = None
) -> tuple[str, float] | None:
    """The table's ``(name, TDP watts)`` for a CPU model name, or None if it is not known.

    The normalized name must equal a table name, or else contain every word of exactly the
    table names (of at least ``MIN_MATCH_TOKENS`` words) with the most words, all of one TDP
    (``"13th Gen Intel(R) Core(TM) i9-13900K"`` finds ``Intel Core i9-13900K``). Two such names
    with different TDPs are ambiguous: None.
    """
    table = load_tdp_table() if table is None else table
    key = normalize_cpu_name(model_name)
    if not key:
        return None
    if key in table:
        return table[key]
    words = set(key.split())
    best: list[tuple[str, float]] = []
    best_len = MIN_MATCH_TOKENS
    for norm, entry in table.items():
        tokens = norm.split()
        if len(tokens) < best_len or not words.issuperset(tokens):
            continue
        if len(tokens) > best_len or not best:
            best, best_len = [], len(tokens)
        best.append(entry)
    if best and len({tdp for _, tdp in best}) == 1:
        return best[0]
    return None


def estimate_idle_w(
    explicit: float | None = None,
    info: CPUInfo | None = None,
    table: dict[str, tuple[str, float]] | None = None,
) -> IdleEstimate:
    """The CPU packages' idle watts: ``explicit`` if given, else from the TDP table, else the
    per-core fallback (see the module docstring).

    Args:
        explicit: Watts to use as they are (``TrainConfig.cpu_idle_w``); None looks them up.
        info: The machine's CPUs; read from ``/proc/cpuinfo`` when None.
        table: The TDP table; the vendored CodeCarbon table when None.
    """
    if explicit is not None:
        return IdleEstimate(float(explicit), f"explicit: cpu_idle_w={float(explicit):g} W")
    info = read_cpuinfo() if info is None else info
    found = lookup_tdp(info.model_name, table)
    if found is not None:
        name, tdp_w = found
        plural = "s" if info.sockets != 1 else ""
        return IdleEstimate(
            IDLE_SHARE_OF_TDP * tdp_w * info.sockets,
            f"tdp-table: {name} ({tdp_w:g} W TDP) x {IDLE_SHARE_OF_TDP:g} x "
            f"{info.sockets} socket{plural}",
        )
    cores = info.physical_cores
    plural = "s" if cores != 1 else ""
    return IdleEstimate(
        FALLBACK_IDLE_W_PER_CORE * cores,
        f"fallback: {FALLBACK_IDLE_W_PER_CORE:g} W x {cores} physical core{plural} "
        f"(CPU {info.model_name or 'unnamed'!r} not in the TDP table)",
    )
