"""A job's claim on the machine and its place there, as the daemon reads them from its
registration (``HELLO``): ``claim_from`` (the claim, refused when malformed) and ``share_of``
(its pid, machine model, minibatch count and the budget it says it holds; a malformed model is
refused, anything else malformed left out)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from autotune.control.allocator import DEFAULT_MIN_SHARE, MIN_GMI_PCT, Budget, Claim, whole
from autotune.control.machine import MachineView
from autotune.control.model_doc import checked_model
from autotune.tuning.perf_model import MachineModel

logger = logging.getLogger(__name__)

CLAIM_FIELDS = ("weight", "min_share", "exclusive", "cores", "mps_pct", "gpu")


@dataclass
class Share:
    """One job's place on the machine."""

    claim: Claim
    pid: int | None = None
    model: MachineModel | None = None
    minibatches: int = 4
    budget: Budget | None = None
    seq: int = 0
    taken: int = 0
    sent_at: float = 0.0
    expires: float | None = None
    """When an offered budget lapses if its job has not registered (None: a registered job)."""
    rate: Any = None
    rate_key: str = ""
    starting_at: float | None = None
    """When it registered while other jobs ran, which keep their cores until it has trained
    (``sharing.STARTING_MAX_S``); None: it is not starting, or no budget overlaps its."""
    first_steps: int | None = None
    """Its trained steps in its first report while starting (a resumed run's are not zero)."""


def claim_from(job: str, doc: Any) -> Claim:
    """The ``Claim`` in a registration's ``claim`` field (missing: the defaults).

    Raises:
        ValueError: a malformed field, naming it and what is allowed.
    """
    doc = doc or {}
    if not isinstance(doc, dict) or set(doc) - set(CLAIM_FIELDS):
        raise ValueError(f"a claim is a map of {', '.join(CLAIM_FIELDS)}; got {doc!r}")
    try:
        cores = doc.get("cores")
        any_gpu = doc.get("gpu") == "any"  # the daemon picks (``gpu_choice``)
        gpu = None if doc.get("gpu") is None or any_gpu else whole(doc["gpu"])
        if not isinstance(doc.get("exclusive", False), bool):
            raise ValueError
        fixed = None
        if cores is not None:
            pct = doc.get("mps_pct")
            fixed = Budget(tuple(whole(c) for c in cores), gpu, None if pct is None else whole(pct))
        claim = Claim(
            job,
            float(doc.get("weight", 1.0)),
            float(doc.get("min_share", DEFAULT_MIN_SHARE)),
            bool(doc.get("exclusive", False)),
            fixed,
            gpu,
            any_gpu,
        )
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"malformed claim {doc!r}: weight and min_share are numbers, exclusive a bool, "
            "cores a list of distinct core numbers, mps_pct an integer, gpu an integer or "
            '"any"'
        ) from None
    listed = list(fixed.cores) if fixed is not None else []
    if len(set(listed)) != len(listed):
        raise ValueError(f"malformed claim: cores {listed}: a core is named twice")
    return claim


def offer_failed(claim: Any, exc: Exception) -> str:
    """The answer to an OFFER whose claim made the share-out fail (not refused as malformed)."""
    return (
        f"no offer for the claim {claim!r:.200}: {type(exc).__name__}: {exc}; a claim is a map "
        f"of {', '.join(CLAIM_FIELDS)} (see ``claim_from``)"
    )


def valid_pid(pid: Any) -> int | None:
    """``pid`` if it is a process id (a positive int, not a bool), else None."""
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def sender_pid(msg: dict[str, Any], peer: int | None) -> int:
    """The pid a HELLO or an OFFER names: a process id, and on an ``ipc://`` socket the
    sender's own (``peer``, from the kernel): a job speaks for its own process only.

    Raises:
        ValueError: no process id, or another process's (what was named and who sent it).
    """
    pid = valid_pid(msg.get("pid"))
    if pid is None:
        raise ValueError(f"a message names the sending process's pid; got {msg.get('pid')!r}")
    if peer is not None and pid != peer:
        raise ValueError(
            f"the message names pid {pid}, but process {peer} sent it: a job offers and "
            "registers for its own process only"
        )
    return pid


def process_gone(pid: int | None) -> bool:
    """Whether the process ``pid`` has ended (a zombie counts as ended: it runs nothing and
    holds nothing but its exit status). False for None: no process is known."""
    import psutil

    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # another user's process: it is there
        return False


def share_of(claim: Claim, hello: dict[str, Any], machine: MachineView) -> Share:
    """A registered job's ``Share``: its pid, its machine model (for its rate), its minibatch
    count, and the budget it says it holds (a daemon started again keeps it where it can).
    Without a model the job is sized as linear; a malformed pid, minibatch count or held budget
    is left out (it has no pid, counts 4 minibatches, or holds nothing).

    Raises:
        ValueError: a malformed machine model, or one whose rate fails (``model_doc``).
    """
    batches = hello.get("minibatches")
    ok = isinstance(batches, int) and not isinstance(batches, bool) and batches >= 1
    batches = batches if ok else 4
    model = None
    if hello.get("machine"):
        gpus = 1 if claim.gpu is not None or claim.any_gpu else 0
        try:
            model = checked_model(hello["machine"], gpus, len(machine.cores), batches)
        except ValueError as exc:
            raise ValueError(f"job {claim.job}: {exc}") from None
    return Share(
        claim, valid_pid(hello.get("pid")), model, batches, budget=held_budget(hello, machine)
    )


def held_budget(hello: dict[str, Any], machine: MachineView) -> Budget | None:
    """The budget a registration says its job holds, where it could be one this daemon hands
    out: distinct cores of the machine, an MPS share within ``MIN_GMI_PCT``..100 % (a share of
    one of the machine's GPUs, where it names one, as every budget on a GPU does). None: none
    named, or not such a budget."""
    try:
        held = Budget.from_dict(hello["held"]) if hello.get("held") else None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None
    if held is None or not held.cores or len(set(held.cores)) != len(held.cores):
        return None
    if not set(held.cores) <= set(machine.cores):
        return None
    pct = held.mps_pct
    if pct is not None and not MIN_GMI_PCT <= pct <= 100:
        return None
    if held.gpu is None:
        return held
    return held if held.gpu in [g.index for g in machine.gpus] and pct is not None else None


def apart(share: Share, shares: dict[str, Share]) -> bool:
    """Whether ``share``'s budget holds no core another registered job's does, and keeps its
    GPU's shares, its own and theirs, within 100 %."""
    mine = share.budget
    if mine is None:
        return True
    others = [
        s.budget
        for j, s in shares.items()
        if j != share.claim.job and s.budget is not None and s.expires is None
    ]
    if any(set(mine.cores) & set(b.cores) for b in others):
        return False
    on_gpu = sum(b.mps_pct or 0 for b in others if mine.gpu is not None and b.gpu == mine.gpu)
    return on_gpu + (mine.mps_pct or 0) <= 100


def clear_of_fixed(share: Share, shares: dict[str, Share]) -> bool:
    """Whether ``share``'s budget (an offer, made before the fixed budgets registered since)
    holds no core of a fixed budget in ``shares`` and keeps its GPU's fixed shares and its own
    within 100 %: a starting job may overlap the flexible jobs' budgets only."""
    if share.budget is None:
        return True
    mine, fixed_pct = set(share.budget.cores), 0
    for job, s in shares.items():
        if job == share.claim.job or s.claim.fixed is None or s.budget is None:
            continue
        if mine & set(s.budget.cores):
            return False
        if share.budget.gpu is not None and s.budget.gpu == share.budget.gpu:
            fixed_pct += s.budget.mps_pct or 0
    return fixed_pct + (share.budget.mps_pct or 0) <= 100
