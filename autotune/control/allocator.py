"""One machine shared among many jobs: each job's budget of cores, GPU and MPS share.

A budget bounds what a job's tuner and ``auto`` sizing may use: its actors, stages and trainer
threads run pinned to the budget's cores, and its GMIs run at most at the budget's share of its
GPU's SMs (GMI-DRL's spatial sharing, here across jobs). ``allocate`` is pure, given:

* the machine (``autotune.control.machine.MachineView``) and the cores foreign processes take;
* each job's ``Claim``: its weight, its fairness floor (``min_share``), exclusive use, or a
  fixed budget the allocator must not touch, and the GPU its GMIs run on;
* each job's rate: what a budget of ``n`` cores and ``s`` % of its GPU gives it, as trained
  steps/s and watts above the machine's idle draw (``model_rate`` reads them off the job's
  fitted throughput/power model at its best config within the budget).

It maximises the machine's total trained steps per joule (every job's steps/s over the idle draw
plus every job's watts) subject to the floors: each job gets at least ``min_share`` of the
steps/s the weighted equal split would give it, and, since a job's model can be wrong (probed
while other jobs loaded the machine), at least ``min_share`` of that split's cores and GPU
share. The search starts from that split and moves
one core, or one ``SHARE_STEP`` of a GPU's share, at a time to wherever the total gains most,
so the result is never below the equal split's total, and every floor holds. Cores are handed out
so that a job keeps those it has where it can (moving a pinned process costs its caches).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.control.cores import format_cores
from autotune.control.machine import MachineView

DEFAULT_MIN_SHARE = 0.8
"""A job's fairness floor: this share of the steps/s the equal split would give it."""
MAX_WEIGHT = 1e6
"""The largest ``weight`` a claim may give (a job a million times another's has it all)."""
SHARE_STEP = 5
"""The granularity of a GPU's MPS share between jobs, in percent."""
MIN_GMI_PCT = 10
"""The least GPU share a job gets: the smallest MPS share a GMI runs at (``knobs.MPS_CHOICES``)."""
MIN_GAIN = 1e-6
"""A move must raise the predicted total steps/J by at least this share."""

Rate = Callable[[int, int], tuple[float, float]]
"""A job's ``(cores, gpu_share_pct) -> (trained steps/s, watts above idle)``."""


class AllocationError(ValueError):
    """Claims the machine cannot meet: the message says what was asked and what is free."""


@dataclass(frozen=True)
class Budget:
    """What one job may use."""

    cores: tuple[int, ...]
    gpu: int | None = None
    mps_pct: int | None = None
    """The job's share of ``gpu``'s SMs, in percent (None: no GPU share)."""

    def to_dict(self) -> dict[str, Any]:
        return {"cores": list(self.cores), "gpu": self.gpu, "mps_pct": self.mps_pct}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Budget:
        """Raises:
        KeyError, TypeError, ValueError: a field missing, or not an integer (or None)."""
        pct = doc.get("mps_pct")
        return cls(
            tuple(whole(c) for c in doc["cores"]),
            None if doc.get("gpu") is None else whole(doc["gpu"]),
            None if pct is None else whole(pct),
        )


def whole(value: Any) -> int:
    """``value`` as an ``int``: an int, or a float with no fractional part.

    Raises:
        ValueError: a bool, a string, a fraction, NaN, an infinity or anything else, named.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float) and not value.is_integer():  # NaN and infinities are not
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


@dataclass(frozen=True)
class Claim:
    """What a job asks of the allocator (``autotune train --weight/--min-share/--exclusive/
    --cores``)."""

    job: str
    weight: float = 1.0
    min_share: float = DEFAULT_MIN_SHARE
    exclusive: bool = False
    fixed: Budget | None = None
    gpu: int | None = None
    """The GPU its GMIs run on (None: it needs no GPU share, or ``any_gpu``)."""
    any_gpu: bool = False
    """It names no GPU: the daemon picks one (``gpu_choice.pick_gpu``) before it is admitted."""

    def problems(self, machine: MachineView) -> list[str]:
        """What is wrong with this claim on ``machine`` (empty when it is fine)."""
        out = []
        if not (math.isfinite(self.weight) and 0 < self.weight <= MAX_WEIGHT):
            out.append(f"weight must be above 0 and at most {MAX_WEIGHT:g}, got {self.weight}")
        if not 0 <= self.min_share <= 1:
            out.append(f"min_share must be within 0..1, got {self.min_share}")
        if self.gpu is not None and self.gpu not in [g.index for g in machine.gpus]:
            out.append(
                f"GPU {self.gpu} is not on this machine; it has "
                f"{[g.index for g in machine.gpus] or 'none'}"
            )
        if self.fixed is not None:
            extra = sorted(set(self.fixed.cores) - set(machine.cores))
            if extra or not self.fixed.cores:
                out.append(
                    f"fixed cores {list(self.fixed.cores)} are not all among the cores the "
                    f"daemon hands out {format_cores(machine.cores)}"
                )
            pct = self.fixed.mps_pct
            if pct is not None and not MIN_GMI_PCT <= pct <= 100:
                out.append(f"a fixed MPS share must be within {MIN_GMI_PCT}..100 %, got {pct}")
            gpus = [g.index for g in machine.gpus]
            if self.fixed.gpu is not None and self.fixed.gpu not in gpus:
                out.append(f"GPU {self.fixed.gpu} is not on this machine; it has {gpus or 'none'}")
            if self.fixed.gpu is not None and pct is None:  # it would hold the GPU unbounded
                out.append(f"a fixed budget on GPU {self.fixed.gpu} must name its MPS share")
        return out


@dataclass
class Allocation:
    """What ``allocate`` decided and what it predicts."""

    budgets: dict[str, Budget]
    predicted: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per job: ``steps_per_s``, ``watts`` (above idle), ``floor`` (steps/s)."""
    steps_per_joule: float = 0.0
    equal_split_steps_per_joule: float = 0.0


def check_admission(
    machine: MachineView, claims: list[Claim], new: Claim, taken_cores: int = 0
) -> str | None:
    """Why ``new`` cannot join ``claims`` on ``machine``, or None (the refusal names what is
    available)."""
    problems = new.problems(machine)
    if problems:
        return "; ".join(problems)
    others = [c for c in claims if c.job != new.job]
    holder = next((c for c in others if c.exclusive), None)
    if holder is not None:
        return f"job {holder.job} has exclusive use of this machine until it ends"
    if new.exclusive and others:
        return (
            f"exclusive use needs an idle machine; {len(others)} job(s) hold budgets now: "
            f"{', '.join(c.job for c in others)}"
        )
    fixed = {c for o in others if o.fixed is not None for c in o.fixed.cores}
    free = [c for c in machine.cores if c not in fixed]
    if new.fixed is not None:
        clash = sorted(set(new.fixed.cores) & fixed)
        if clash:
            return (
                f"cores {format_cores(clash)} are fixed to other jobs; free: {format_cores(free)}"
            )
    flexible = [c for c in [*others, new] if c.fixed is None]
    left = len(free) - (len(new.fixed.cores) if new.fixed is not None else 0) - taken_cores
    if flexible and left < len(flexible):
        return (
            f"no core left for it: {len(machine.cores)} cores to hand out, "
            f"{len(machine.cores) - len(free)} fixed to other jobs, {taken_cores} busy with "
            f"processes the daemon does not manage, and {len(flexible)} jobs need one each"
        )
    for gpu in {c.gpu for c in flexible if c.gpu is not None}:
        fixed_pct = sum(
            o.fixed.mps_pct or 0
            for o in [*others, new]
            if o.fixed is not None and o.fixed.gpu == gpu
        )
        sharing = sum(1 for c in flexible if c.gpu == gpu)
        if 100 - fixed_pct < MIN_GMI_PCT * sharing:
            own = new.fixed.mps_pct if new.fixed is not None and new.fixed.gpu == gpu else None
            fits = 100 - (fixed_pct - (own or 0)) - MIN_GMI_PCT * sharing
            most = f"; at most {max(fits, 0)} % would fit it" if own is not None else ""
            return (
                f"GPU {gpu} has {100 - fixed_pct} % of its SMs not fixed to jobs, and "
                f"{sharing} jobs would share it at {MIN_GMI_PCT} % each, a GMI's least share"
                f"{most}"
            )
    if new.fixed is not None and new.fixed.mps_pct is not None and new.fixed.gpu is not None:
        used = sum(
            o.fixed.mps_pct or 0
            for o in others
            if o.fixed is not None and o.fixed.gpu == new.fixed.gpu
        )
        if used + new.fixed.mps_pct > 100:
            return (
                f"GPU {new.fixed.gpu} has {100 - used} % of its SMs not fixed to other jobs; "
                f"asked {new.fixed.mps_pct} %"
            )
    return None


def allocate(
    machine: MachineView,
    claims: list[Claim],
    rates: dict[str, Rate],
    idle_w: float = 0.0,
    taken_cores: int = 0,
    current: dict[str, Budget] | None = None,
) -> Allocation:
    """Budgets for every claim (see the module docstring).

    Args:
        machine: What there is to hand out.
        claims: The jobs' claims (at most one exclusive, and then alone).
        rates: Each job's rate function (a job without one counts as linear in its cores).
        idle_w: The machine's idle draw (the GPUs' and the CPU packages').
        taken_cores: Cores foreign processes keep busy: handed out only where every job would
            otherwise be left with none.
        current: The budgets jobs hold now (kept where the counts allow).

    Raises:
        AllocationError: the claims cannot all be met (``check_admission`` says which).
    """
    for i, c in enumerate(claims):
        why = check_admission(machine, claims[:i], c, 0)
        if why is not None:
            raise AllocationError(f"job {c.job}: {why}")
    fixed = {c.job: c.fixed for c in claims if c.fixed is not None}
    flex = [c for c in claims if c.fixed is None]
    pool = [k for k in machine.cores if not any(k in b.cores for b in fixed.values())]
    usable = max(len(flex), len(pool) - taken_cores)
    shares = _gpu_room(machine, fixed)
    rate = {c.job: rates.get(c.job) or linear for c in flex}

    n = _split(usable, {c.job: c.weight for c in flex}, 1)
    s: dict[str, int] = {}
    for gpu, room in shares.items():
        on = {c.job: c.weight for c in flex if c.gpu == gpu}
        if on:  # admission saw to room for every job's least share
            s.update(_split(room // SHARE_STEP, on, MIN_GMI_PCT // SHARE_STEP))
    s = {j: k * SHARE_STEP for j, k in s.items()}
    memo: dict[tuple[str, int, int], tuple[float, float]] = {}

    def r(job: str, cores: int, pct: int) -> tuple[float, float]:
        key = (job, cores, pct)
        if key not in memo:
            memo[key] = rate[job](cores, pct)
        return memo[key]

    def total(nn: dict[str, int], ss: dict[str, int]) -> float:
        return _steps_per_joule([r(j, nn[j], ss.get(j, 0)) for j in nn], idle_w)

    floor = {c.job: c.min_share * r(c.job, n[c.job], s.get(c.job, 0))[0] for c in flex}
    least = {  # the floor in resources too: a model probed on a loaded machine can be wrong
        c.job: (
            max(1, math.floor(c.min_share * n[c.job])),
            _step_floor(c.min_share * s.get(c.job, 0)),
        )
        for c in flex
    }
    equal = total(n, s) if flex else 0.0
    best = equal
    while len(flex) > 1:
        move = None
        for give in flex:
            for take in flex:
                if give is take:
                    continue
                for nn, ss in _moves(give, take, n, s):
                    if any(
                        nn[j] < least[j][0]
                        or ss.get(j, 0) < least[j][1]
                        or r(j, nn[j], ss.get(j, 0))[0] < floor[j] * (1 - 1e-9)
                        for j in nn
                    ):
                        continue
                    t = total(nn, ss)
                    if t > best * (1 + MIN_GAIN):
                        best, move = t, (nn, ss)
        if move is None:
            break
        n, s = move
    budgets = dict(fixed)
    cores = _place(pool, n, current or {})
    for c in flex:
        pct = s.get(c.job, 0) if c.gpu is not None else None
        budgets[c.job] = Budget(cores[c.job], c.gpu, pct)
    predicted = {
        c.job: {
            "steps_per_s": r(c.job, n[c.job], s.get(c.job, 0))[0],
            "watts": r(c.job, n[c.job], s.get(c.job, 0))[1],
            "floor": floor[c.job],
        }
        for c in flex
    }
    return Allocation(budgets, predicted, best, equal)


def total_of(budgets: dict[str, Budget], rates: dict[str, Rate], idle_w: float = 0.0) -> float:
    """The machine's predicted steps/J under ``budgets`` (fixed ones count at their size)."""
    out = [(rates.get(j) or linear)(len(b.cores), b.mps_pct or 0) for j, b in budgets.items()]
    return _steps_per_joule(out, idle_w)


def _steps_per_joule(rates: list[tuple[float, float]], idle_w: float) -> float:
    """Total steps/s over total watts (the idle draw counted once) of ``(steps/s, W)`` pairs."""
    watts = idle_w + sum(w for _, w in rates)
    steps = sum(s for s, _ in rates)
    return steps / watts if watts > 0 else steps


def linear(cores: int, pct: int) -> tuple[float, float]:
    """A job nothing is known about: steps and watts in proportion to its cores."""
    return float(cores), 10.0 * cores


def _gpu_room(machine: MachineView, fixed: dict[str, Budget]) -> dict[int, int]:
    """Per GPU, the share (whole ``SHARE_STEP``s) not fixed to a job."""
    room = {g.index: 100 for g in machine.gpus}
    for b in fixed.values():
        if b.gpu is not None and b.gpu in room:
            room[b.gpu] -= b.mps_pct or 0  # a fixed budget holds only the share it names
    return {g: max(0, v) // SHARE_STEP * SHARE_STEP for g, v in room.items()}


def _step_floor(pct: float) -> int:
    """``pct`` rounded down to a whole ``SHARE_STEP``."""
    return int(pct // SHARE_STEP) * SHARE_STEP


def _split(units: int, weights: dict[str, float], least: int) -> dict[str, int]:
    """``units`` split in proportion to ``weights`` (largest remainder); then any job under
    ``least`` is raised to it with units of the jobs that hold the most."""
    if not weights:
        return {}
    top = max(weights.values())
    weights = {j: w / top for j, w in weights.items()}  # no overflow, however large
    total = sum(weights.values())
    raw = {j: units * w / total for j, w in weights.items()}
    out = {j: math.floor(v) for j, v in raw.items()}
    left = units - sum(out.values())
    for j in sorted(raw, key=lambda j: (-(raw[j] - math.floor(raw[j])), j))[:left]:
        out[j] += 1
    for j in sorted(out, key=lambda j: (out[j], j)):
        while out[j] < least and (rich := [k for k in out if out[k] > least]):
            donor = max(rich, key=lambda k: (out[k], k))
            out[donor], out[j] = out[donor] - 1, out[j] + 1
    return out


def _moves(give: Claim, take: Claim, n: dict[str, int], s: dict[str, int]):
    """The allocations one step away: a core, or a share step of a common GPU, from ``give``
    to ``take``."""
    if n[give.job] > 1:
        yield {**n, give.job: n[give.job] - 1, take.job: n[take.job] + 1}, s
    same_gpu = give.gpu is not None and give.gpu == take.gpu
    if same_gpu and s.get(give.job, 0) - SHARE_STEP >= MIN_GMI_PCT:
        yield n, {**s, give.job: s[give.job] - SHARE_STEP, take.job: s[take.job] + SHARE_STEP}


def _place(pool: list[int], counts: dict[str, int], current: dict[str, Budget]) -> dict[str, tuple]:
    """Core ids for each job's count: a job keeps its current cores where its count allows,
    those no other job holds first (a job that registers again after a daemon restart gets
    its own back from one that grew meanwhile), in ``pool``'s order (a foreign process's
    pinned cores last: a job that shrinks gives those up first); the rest come from the free
    cores in that order."""
    free = list(pool)
    holders = collections.Counter(
        k for job, b in current.items() if job in counts for k in set(b.cores)
    )
    out: dict[str, list[int]] = {job: [] for job in counts}
    for contested in (False, True):
        for job in sorted(counts):
            held = current.get(job)
            need = counts[job] - len(out[job])
            own = set(held.cores if held else ())
            mine = [k for k in free if k in own and (contested or holders[k] == 1)][:need]
            out[job] += mine
            for k in mine:
                free.remove(k)
    for job in sorted(counts):
        need = counts[job] - len(out[job])
        out[job] += free[:need]
        del free[:need]
    return {job: tuple(sorted(v)) for job, v in out.items()}
