"""The daemon's share-out of the machine among its jobs (``autotune.control.allocator``), kept
as jobs come and go.

* A job's claim comes with its registration (``HELLO``'s ``claim``); ``admit`` refuses one the
  machine cannot meet, saying what is available. ``offer`` answers a job that asks before it
  sizes itself (``OFFER``) with the budget it would get now; the registered jobs keep theirs
  until the next share-out, which leaves the offered cores to the job probing there, and jobs
  sizing themselves at the same time get disjoint cores where the machine has room for that.
* The share-out is recomputed when a job joins or leaves (a silent job is dropped, see
  ``protocol.too_silent``, and its budget goes back), and every ``REBALANCE_S``
  with the jobs' fitted models and the foreign load read again; a periodic change is made only
  where it predicts at least ``REBALANCE_GAIN`` more steps/J, so budgets do not churn.
* A job that registers while others run starts inside the budget it was offered, and the jobs
  already running keep their cores until it has trained its first batch (its reports say so;
  at most ``STARTING_MAX_S``; two starting at once are both shared out at the first one's): its
  trainer spends its first seconds starting and compiling, its cores mostly idle, and a cut made
  at once would idle theirs too. Until then budgets overlap, as while it probed in its offer.
* A changed budget goes to its job as a ``BUDGET`` message (sent again every
  ``BUDGET_RESEND_S`` until the job's reports say it took it) and to its tuner as limits
  (``autotune.tuning.budget``): the job pins its processes to the cores, and the tuner moves
  its config inside the budget through the live changes the runtime already has.
* A daemon started again rebuilds the share-out from the jobs' registrations: each names the
  budget it holds, which it keeps exactly for ``RESTART_GRACE_S`` (while the others come back),
  and then where the counts allow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from autotune.control.allocator import (
    Allocation,
    AllocationError,
    Budget,
    Claim,
    allocate,
    check_admission,
    total_of,
)
from autotune.control.claims import Share, apart, clear_of_fixed, process_gone
from autotune.control.gpu_choice import pick_gpu
from autotune.control.machine import MachineView, busy_last, foreign_load, process_trees
from autotune.control.rates import guarded, model_rate, sized_keeping
from autotune.tuning.perf_model import Params

logger = logging.getLogger(__name__)

OFFER_HOLD_S = 300.0
"""How long later offers avoid the cores offered to a job that sizes itself (its probes)."""
REBALANCE_S = 30.0
REBALANCE_GAIN = 0.03
BUDGET_RESEND_S = 2.0
STARTING_MAX_S = 90.0
"""The longest the running jobs keep their cores for a job that has registered but not trained."""
RESTART_GRACE_S = 10.0
"""After the daemon starts, a job that registers with the budget it holds keeps exactly that
budget, and the machine is shared out again once this has passed: a daemon started again would
otherwise give the first job back every core, those the others still hold included."""


class MachineShares:
    """Args:
    machine: What the daemon hands out.
    on_budget: Called with a job id, its budget and whether it changed (False: a resend the job
        has not acknowledged yet); the daemon sends it and, where it changed, limits the job's
        tuner.
    params_of: A job's fitted model multipliers, where its tuner has fitted them.
    """

    def __init__(
        self,
        machine: MachineView,
        on_budget: Callable[[str, Budget, bool], None],
        params_of: Callable[[str], Params | None] = lambda job: None,
        clock: Callable[[], float] = time.monotonic,
        read_foreign: bool = True,
    ) -> None:
        self.machine, self.on_budget, self.params_of = machine, on_budget, params_of
        self.clock = clock
        self.shares: dict[str, Share] = {}
        self.allocation: Allocation | None = None
        self.read_foreign = read_foreign
        self.foreign: dict[str, Any] = {"cores": 0, "pinned": [], "gpus": [], "pids": []}
        if read_foreign:  # psutil's first reading of a process is 0: this one primes them
            self._read_foreign(set())
        self.rebalanced = clock()
        self.grace_until: float | None = clock() + RESTART_GRACE_S

    def admit(
        self, claim: Claim, pid: int | None = None, budget: Budget | None = None
    ) -> str | None:
        """Why ``claim`` cannot join now (what is available), or None. A budget offered to
        process ``pid`` is its own, not another job's; ``budget``: the one it says it holds (on
        its GPU, as ``join`` will place it)."""
        claim = self._placed(claim, pid, budget)
        return check_admission(self.machine, self._others(claim, pid), claim, self.foreign["cores"])

    def _others(self, claim: Claim, pid: int | None) -> list[Claim]:
        """The claims held besides ``claim``'s own and the budget offered to process ``pid``."""
        mine = (claim.job, f"offer-{pid}")
        return [s.claim for j, s in self.shares.items() if j not in mine]

    def _placed(self, claim: Claim, pid: int | None, budget: Budget | None = None) -> Claim:
        """``claim`` on a GPU where it names none: the one its ``budget``, or the budget offered
        to process ``pid``, is on, else the daemon's pick (``gpu_choice.pick_gpu``)."""
        if not claim.any_gpu:
            return claim
        offered = self.shares.get(f"offer-{pid}")
        budget = budget or (offered.budget if offered is not None else None)
        if budget is not None and budget.gpu is not None:
            fixed = None if claim.fixed is None else replace(claim.fixed, gpu=budget.gpu)
            return replace(claim, gpu=budget.gpu, any_gpu=False, fixed=fixed)
        foreign = frozenset(self.foreign.get("gpus") or ())  # another's load: last
        return pick_gpu(self.machine, self._others(claim, pid), claim, foreign)

    def offer(self, claim: Claim, pid: int | None = None) -> Budget:
        """The budget ``claim`` would get if it joined now, for the job to size itself inside.
        Registered jobs keep their budgets for now (it probes on cores they may still use);
        a share-out made while it probes (``rebalance``) leaves it the offered cores. Other
        jobs that size themselves at the same time are offered
        disjoint cores: an offer counts, as the claim ``offer-<pid>``, in later offers for
        ``OFFER_HOLD_S`` or until its job registers. Where the offers hold every core, they
        are shared out again instead (the earlier job is cut when it registers).

        Raises:
            AllocationError: it cannot join (the reason names what is available).
        """
        self._lapse_offers()
        key = f"offer-{pid}"
        claim = self._placed(replace(claim, job=key), None)
        why = self.admit(claim, pid)
        if why is not None:
            raise AllocationError(why)
        held = [s for j, s in self.shares.items() if j != key]
        try:  # jobs probing inside an offer keep its cores: new offers avoid them
            alloc = self._offer_split(claim, held, keep_offers=True)
        except AllocationError:  # where that leaves no room, the offers are shared out again
            alloc = self._offer_split(claim, held, keep_offers=False)
        budget = alloc.budgets[key]
        self.shares[key] = Share(claim, pid, budget=budget, expires=self.clock() + OFFER_HOLD_S)
        return budget

    def _offer_split(self, claim: Claim, held: list[Share], keep_offers: bool) -> Allocation:
        others = [
            replace(s.claim, fixed=s.budget)
            if keep_offers and s.expires is not None and s.budget
            else s.claim
            for s in held
        ]
        return self._split([*others, claim], self._rates(), self._current(registered_only=False))

    def join(self, share: Share) -> None:
        """Adds a job (admitted) and shares the machine out again; the budget offered to its
        process, if any, becomes the one it holds."""
        share.claim = self._placed(share.claim, share.pid, share.budget)
        offered = self.shares.pop(f"offer-{share.pid}", None)
        # named in its registration, and not as this daemon's offer: it held it before
        held = share.budget is not None and (offered is None or share.budget != offered.budget)
        if share.budget is None and offered is not None:
            share.budget = offered.budget
        self.shares[share.claim.job] = share
        if held and self.grace_until is not None and apart(share, self.shares):
            share.seq += 1  # just started (again): it keeps what it holds (``RESTART_GRACE_S``)
            self._send(share.claim.job, share, changed=True)
            return
        running = any(s.expires is None and j != share.claim.job for j, s in self.shares.items())
        overlap_ok = share.claim.fixed is None and not share.claim.exclusive
        overlap_ok = overlap_ok and clear_of_fixed(share, self.shares)
        if overlap_ok and not held and running and share.budget is not None:
            share.starting_at = self.clock()  # the others keep their cores until it trains
            share.seq += 1
            self._send(share.claim.job, share, changed=True)
            return
        self.rebalance(force=True)

    def progressed(self, job: str, trained_steps: int) -> None:
        """A job's report of its trained steps: a starting job that has trained since its first
        report ends the overlap, and the machine is shared out again."""
        share = self.shares.get(job)
        if share is None or share.starting_at is None:
            return
        if share.first_steps is None:
            share.first_steps = trained_steps
        elif trained_steps > share.first_steps:
            logger.info("job %s trained its first batch: sharing the machine out again", job)
            self.rebalance(force=True)

    def _kept_for_start(self) -> bool:
        """Whether the running jobs still keep their cores for a job that has not trained yet."""
        now = self.clock()
        return any(
            s.starting_at is not None and now - s.starting_at < STARTING_MAX_S
            for s in self.shares.values()
        )

    def leave(self, job: str, rebalance: bool = True) -> None:
        """A job ended, left or went silent: its budget goes back to the others (not when the
        daemon stops: the jobs keep what they have)."""
        if self.shares.pop(job, None) is not None and rebalance:
            self.rebalance(force=True)

    def taken(self, job: str, seq: Any) -> None:
        """A job's report says which budget it has taken."""
        share = self.shares.get(job)
        if share is not None and isinstance(seq, int) and seq <= share.seq:  # one it was sent
            share.taken = max(share.taken, seq)

    def _lapse_offers(self) -> bool:
        """Drops the offers whose job never registered: held past ``OFFER_HOLD_S``, or whose
        process has ended (a failed start, a kill during its probes); whether any lapsed."""
        now = self.clock()
        lapsed = [
            j
            for j, s in self.shares.items()
            if s.expires is not None and (now > s.expires or process_gone(s.pid))
        ]
        for job in lapsed:
            del self.shares[job]
        return bool(lapsed)

    def tick(self) -> None:
        now = self.clock()
        lapsed = self._lapse_offers()
        for job, share in self.shares.items():
            if share.expires is not None:
                continue
            if share.budget and share.taken < share.seq and now - share.sent_at >= BUDGET_RESEND_S:
                self._send(job, share, changed=False)
        if self.grace_until is not None and now >= self.grace_until:
            self.grace_until = None  # the jobs that held budgets are back: share out anew
            if any(s.expires is None for s in self.shares.values()):
                self.rebalance(force=True)
        starting = any(s.starting_at is not None for s in self.shares.values())
        if starting and not self._kept_for_start() and now - self.rebalanced >= BUDGET_RESEND_S:
            self.rebalance(force=True)  # a starting job that has not trained in STARTING_MAX_S
        elif lapsed and not starting and self.grace_until is None:
            self.rebalance(force=True)  # its cores go back to the jobs (a start keeps its overlap)
        elif now - self.rebalanced >= REBALANCE_S and not starting:
            if self.read_foreign:
                self._read_foreign({s.pid for s in self.shares.values() if s.pid})
            self.rebalance(force=False)

    def _read_foreign(self, managed: set[int]) -> None:
        """Reads what processes outside ``managed`` take (``foreign_load``); where that fails
        (NVML lost a GPU), the last reading stands and the share-out goes on."""
        try:
            self.foreign = foreign_load(process_trees(managed), self.machine.cores)
        except Exception as exc:
            logger.warning(
                "cannot read what other processes take (%s); the last reading stands", exc
            )

    def rebalance(self, force: bool) -> None:
        """Shares the machine out again among the registered jobs; applied if ``force`` or it
        pays ``REBALANCE_GAIN``. The cores of pending offers stay with them (a job leaving
        while another probes grows the others only into what it frees beside the offer),
        unless that leaves the registered jobs too little."""
        self.rebalanced = self.clock()
        jobs = {j: s for j, s in self.shares.items() if s.expires is None}
        if not jobs:
            self.allocation = None
            return
        rates, current = self._rates(), self._current(registered_only=True)
        offers = [  # jobs probing in their offers keep those cores: no job grows into them
            replace(s.claim, fixed=s.budget)
            for s in self.shares.values()
            if s.expires is not None and s.budget
        ]
        claims = [s.claim for s in jobs.values()]
        try:
            try:
                alloc = self._split([*claims, *offers], rates, current)
            except AllocationError:  # the offers leave the jobs too little: they are shared
                alloc = self._split(claims, rates, current)  # out when their jobs register
        except Exception as exc:  # foreign load past what the jobs need; a model that fails
            logger.warning("cannot share the machine out again: %s", exc)
            return  # an overlap past its time is tried again (``tick``)
        mine = {j: b for j, b in alloc.budgets.items() if j in jobs}
        for share in jobs.values():  # shared out whole: no budgets overlap any more (a job still
            share.starting_at = None  # starting gets its share of the split as it is)
        if not force and len(current) == len(jobs):
            before, after = total_of(current, rates), total_of(mine, rates)
            if after < before * (1 + REBALANCE_GAIN):
                return
        self.allocation = alloc
        for job, budget in mine.items():
            share = jobs[job]
            if share.budget != budget or share.seq == 0:  # a held budget: limits to the tuner
                share.budget, share.seq = budget, share.seq + 1
                try:
                    self._send(job, share, changed=True)
                except Exception:  # one job's tuner (its storage) must not stop the others
                    logger.exception("job %s: its new budget was not taken by its tuner", job)

    def _split(
        self, claims: list[Claim], rates: dict[str, Any], current: dict[str, Budget]
    ) -> Allocation:
        """``allocate`` on this machine, less what other processes take; no idle draw of its
        own: each job's watts carry its share of it."""
        return allocate(
            busy_last(self.machine, self.foreign["pinned"]),
            claims,
            rates,
            taken_cores=self.foreign["cores"],
            current=current,
        )

    def sized(
        self, job: str, budget: Budget, running: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The config the job's model picks inside ``budget`` (None without a model). With the
        job's ``running`` config, its costly values are kept where changing them pays less than
        ``rates.KEEP_GAIN`` (``rates.sized_keeping``)."""
        share = self.shares.get(job)
        if share is None or share.model is None:
            return None
        gpus = 1 if budget.gpu is not None else 0
        cores, total = len(budget.cores), len(self.machine.cores)
        args = (share.model, gpus, total, cores, budget.mps_pct or 0, share.minibatches)
        return sized_keeping((*args, self.params_of(job)), running)

    def status(self) -> dict[str, Any]:
        """The machine, the foreign load, the share-out's prediction, and the offers pending:
        processes sizing themselves (probing) on the cores offered, not registered yet."""
        alloc, now = self.allocation, self.clock()
        offers = [
            {
                "pid": s.pid,
                "allocation": s.budget.to_dict(),
                "for_s": now - s.expires + OFFER_HOLD_S,
            }
            for s in self.shares.values()
            if s.expires is not None and s.budget is not None
        ]
        return {
            "machine": self.machine.to_dict(),
            "foreign": self.foreign,
            "offers": offers,
            "steps_per_joule_predicted": alloc.steps_per_joule if alloc else None,
            "equal_split_steps_per_joule": alloc.equal_split_steps_per_joule if alloc else None,
        }

    def job_status(self, job: str) -> dict[str, Any]:
        share = self.shares.get(job)
        if share is None:
            return {}
        predicted = self.allocation.predicted.get(job) if self.allocation else None
        return {
            "allocation": share.budget.to_dict() if share.budget else None,
            "allocation_taken": share.taken >= share.seq,
            "starting": share.starting_at is not None,
            "claim": {
                "weight": share.claim.weight,
                "min_share": share.claim.min_share,
                "exclusive": share.claim.exclusive,
                "fixed": share.claim.fixed is not None,
            },
            "predicted": predicted,
        }

    def _send(self, job: str, share: Share, changed: bool) -> None:
        share.sent_at = self.clock()
        self.on_budget(job, share.budget, changed)

    def _current(self, registered_only: bool) -> dict[str, Budget]:
        return {
            j: s.budget
            for j, s in self.shares.items()
            if s.budget is not None and (s.expires is None or not registered_only)
        }

    def _rates(self) -> dict[str, Any]:
        """Each modelled job's rate function, kept while its fitted multipliers stay the same
        (a rate caches the sizing of every budget it was asked about); one that fails counts
        as linear (``rates.guarded``)."""
        out = {}
        for job, s in self.shares.items():
            if s.model is None:
                continue
            params = self.params_of(job)
            key = repr((len(self.machine.cores), s.claim.gpu is not None, params))
            if s.rate is None or s.rate_key != key:
                gpus = 1 if s.claim.gpu is not None else 0
                total = len(self.machine.cores)
                s.rate = guarded(job, model_rate(s.model, gpus, total, s.minibatches, params))
                s.rate_key = key
            out[job] = s.rate
        return out
