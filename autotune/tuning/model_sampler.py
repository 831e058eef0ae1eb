"""The model-guided sampler: the next config is the one with the best expected improvement under
the fitted throughput and power model (``autotune.tuning.perf_model``), discounted by what the
change costs, never one predicted far below the incumbent.

It is an ``optuna.samplers.BaseSampler``, so the study stays the store and the interface
(``status``, export and the dashboard read it as before). For each trial it:

1. fits the model to every completed trial's window (their ``steps_per_s``, ``gpu_j``,
   ``cpu_j``, ``window_s`` and ``policy_lag`` attributes), primed by the probes;
2. predicts, for every config in the trust region around the incumbent over the knobs the
   model describes (actors, envs per actor, batch size, trainer device, trainers, MPS share,
   trainer threads; other knobs stay at the incumbent's values), the log of the objective
   (steps/J, steps/s, goodput per joule, or ``weighted``'s mean of steps/s and steps/J
   relative to the study's first window) and its uncertainty, which grows with the distance
   to the nearest measured config. The trust region: any actor count, and at most
   ``trust_knobs`` other knobs moved, a numeric one by at most ``trust_factor`` times (far
   from anything measured the model's uncertainty is largest, and a jump there, such as one
   env per actor with a 64k batch, can stall a job for its whole window);
3. drops configs measured or failed before, and those over the policy-lag ceiling; once the
   study has measured ``caution_after_s`` of windows, also those predicted below ``caution``
   times the incumbent unless their uncertainty exceeds ``unsure`` (the model cannot tell);
4. scores the rest by what trying each is expected to gain, net of what the trial is expected
   to give up (``net_gain``): its expected improvement over the incumbent's median (log scale)
   kept for ``horizon_s``, less its expected shortfall below the incumbent over the trial
   (``window_s`` and half the change's cost in seconds: a respawn or a GMI hand-over costs
   seconds, during which the old config runs on in part; a batch-size change costs nothing;
   each kind at what this study's own changes of it took, once measured:
   ``tuner_rules.change_costs``),
   over ``horizon_s`` plus that cost. A config the model predicts below the incumbent is tried
   only where its uncertainty is wide enough to repay its trial: on Ant-v5 (an H200 host) a
   goodput tuner tried 14 actors x 2 envs, predicted at 0.91 of its incumbent with a spread of
   0.16, which then measured 0.69 of it for a 37-s trial (a GMI hand-over and a respawn);
5. suggests the best; when no config is expected to gain ``min_gain``, it suggests the
   incumbent again (the tuner then measures it once more; its median firms up).

A knob the model does not describe that a user named (``autotune.tuning.knobs.OPT_IN``: the env
backend, actor niceness, the trainer's precision) is measured instead: once the incumbent has
a window, each of its untried values in turn, the rest of the incumbent kept. The model is
fitted to the windows of the incumbent's values of those knobs only (another env backend steps
at other rates).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.tuning.acquisition import expected_improvement, net_gain
from autotune.tuning.budget import fits, machine_within
from autotune.tuning.knobs import OPT_IN
from autotune.tuning.model_inputs import goodput_factor, newest_noise_scale, update_samples
from autotune.tuning.perf_model import (
    MachineModel,
    Window,
    distance,
    evaluate,
    features,
    fit,
    uncertainty,
)
from autotune.tuning.settings import OBJECTIVES, TunerSettings, first_window, weighted
from autotune.tuning.sizing import fits_cores
from autotune.tuning.storage import failed_configs
from autotune.tuning.tuner_rules import CHANGE_COST_S, change_costs, change_kinds

MODELLED = (
    "actors",
    "envs_per_actor",
    "batch_size",
    "trainer_device",
    "trainers",
    "mps_pct",
    "trainer_threads",
)
MAX_CANDIDATES = 60_000


class ModelSampler(optuna.samplers.BaseSampler):
    """See the module docstring.

    Args:
        machine: The probes' and the hardware's facts.
        choices: Each tuned knob's choices.
        defaults: The job's values of every knob (what an untuned knob stays at).
        applies: How each knob applies (``autotune.tuning.knobs.Knob.apply``).
        objective: ``steps_per_joule``, ``goodput_per_joule``, ``steps_per_s`` or ``weighted``
            (``weight`` x steps/s + the rest x steps/J, relative to the study's first window:
            ``settings.weighted``).
        lag_ceiling: Configs predicted over this lag are not suggested (None: no ceiling).
        window_s: The tuner's shortest window: what a trial runs its config for at least, its
            expected shortfall counted over it (``net_gain``).
    """

    def __init__(
        self,
        machine: MachineModel,
        choices: dict[str, tuple[Any, ...]],
        defaults: dict[str, Any],
        applies: dict[str, str],
        objective: str = "steps_per_joule",
        lag_ceiling: float | None = None,
        seed: int | None = None,
        caution: float = 0.7,
        caution_after_s: float = 45.0,
        unsure: float = 0.35,
        min_gain: float = 0.01,
        horizon_s: float = 60.0,
        trust_knobs: int = 2,
        trust_factor: float = 4.0,
        window_s: float = 10.0,
        weight: float = 0.5,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: the model sampler rates {OBJECTIVES}")
        self.machine, self.choices, self.defaults = machine, dict(choices), dict(defaults)
        self.applies = {n: applies.get(n, "live") for n in self.choices}
        self.objective, self.lag_ceiling, self.weight = objective, lag_ceiling, weight
        self.caution, self.caution_after_s, self.unsure = caution, caution_after_s, unsure
        self.min_gain, self.horizon_s, self.window_s = min_gain, horizon_s, window_s
        self.trust_knobs, self.trust_factor = trust_knobs, trust_factor
        self.rng = np.random.default_rng(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any]] = {}
        self.last: dict[str, Any] = {}
        """What the last plan saw and chose (for logs and tests)."""
        self.limits: dict[str, int] | None = None
        self.costs = dict(CHANGE_COST_S)
        """Seconds a change costs by how it applies: this study's own, once measured."""
        self.named = [n for n in OPT_IN if n in self.choices]  # measured, not modelled

    def set_limits(self, limits: dict[str, int] | None) -> None:
        """Plans only inside a budget's limits (``autotune.tuning.budget``)."""
        self.limits = limits

    # --- optuna's interface -----------------------------------------------------------------

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, name: str, dist: BaseDistribution
    ) -> Any:
        plan = self._plans.get(trial.number)
        if plan is None:
            plan = self._plans[trial.number] = self.plan(study)
        choices = getattr(dist, "choices", ())
        if name in plan and plan[name] in choices:
            return plan[name]
        return self._fallback.sample_independent(study, trial, name, dist)

    # --- the plan -------------------------------------------------------------------------

    def _measured(self, study: optuna.Study) -> tuple[list[Window], dict[str, list[float]]]:
        windows, by_config = [], {}
        noise = newest_noise_scale(study)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            a = t.user_attrs
            span = a.get("window_s") or 0.0
            if span <= 0 or "steps_per_s" not in a:
                continue
            values = {**self.defaults, **t.params}
            watts = (a.get("gpu_j", 0.0) / span, a.get("cpu_j", 0.0) / span)
            lag = a.get("policy_lag", 0.0)
            windows.append(Window(values, a["steps_per_s"], *watts, lag, a.get("node_rates")))
            if a.get("feasible", True) and t.value is not None:
                by_config.setdefault(self._key(values), []).append(self._rated(t, values, noise))
        return windows, by_config

    def _rated(self, t: FrozenTrial, values: dict[str, Any], noise: float | None) -> float:
        """A window's objective; for goodput, its steps/J times its batch's efficiency at the
        newest noise scale ``noise`` (``autotune.tuning.job.History.score`` says why)."""
        from policies.noise_scale import goodput_per_joule

        spj, batch = t.user_attrs.get("steps_per_joule"), update_samples(values)  # as History
        if self.objective != "goodput_per_joule" or not noise or spj is None or not batch:
            return float(t.value)
        return goodput_per_joule(float(spj), noise, batch)

    def _candidates(self, hold: dict[str, Any]) -> list[dict[str, Any]]:
        """The configs inside the trust region around ``hold`` (the module docstring): every
        actor count, with at most ``trust_knobs`` other knobs moved to values within
        ``trust_factor`` of ``hold``'s."""
        tuned, threads = [n for n in MODELLED if n in self.choices], self._cuda_threads()
        near = {n: [v for v in self.choices[n] if self._close(hold.get(n), v)] for n in tuned}
        free = [n for n in tuned if n == "actors"]
        others = [n for n in tuned if n != "actors"]
        if self.trust_knobs >= len(others):  # no limit on how many move: one grid
            groups = [(tuple(free) + tuple(others), [near[n] for n in free + others])]
        else:
            groups = [
                (
                    tuple(free) + moved,
                    [near[n] for n in free]
                    + [[v for v in near[n] if v != hold.get(n)] for n in moved],
                )
                for k in range(self.trust_knobs + 1)
                for moved in itertools.combinations(others, k)
            ]
        out = []
        for names, grid in groups:
            size = math.prod(len(g) for g in grid)
            if size <= MAX_CANDIDATES:
                combos = itertools.product(*grid)
            else:
                combos = (
                    tuple(g[self.rng.integers(len(g))] for g in grid) for _ in range(MAX_CANDIDATES)
                )
            for combo in combos:
                c = {**hold, **dict(zip(names, combo, strict=True))}
                if c.get("trainer_device") == "cpu" and c.get("mps_pct", 100) != 100:
                    continue  # the MPS share means nothing to a CPU trainer
                cuda = c.get("trainer_device", self.defaults.get("trainer_device")) == "cuda"
                if cuda and c.get("trainer_threads", threads) != threads:
                    continue  # nor a thread count to a CUDA one: a hand-over for nothing
                out.append(c)
        return out

    def _close(self, x: Any, y: Any) -> bool:
        """Whether a knob may move from ``x`` to ``y`` in one step (numbers by at most
        ``trust_factor`` times; anything else freely)."""
        numeric = isinstance(x, int | float) and isinstance(y, int | float) and x and y
        return not numeric or max(x / y, y / x) <= self.trust_factor * (1 + 1e-9)

    def _key(self, values: dict[str, Any]) -> str:
        """A config's identity over the tuned knobs (a CPU trainer has no MPS share, a CUDA
        trainer no thread count)."""
        out = {n: values.get(n, self.defaults.get(n)) for n in self.choices}
        device = values.get("trainer_device", self.defaults.get("trainer_device"))
        if device == "cpu" and "mps_pct" in out:
            out["mps_pct"] = 100
        if device == "cuda" and "trainer_threads" in out:
            out["trainer_threads"] = self._cuda_threads()
        return json.dumps(out, sort_keys=True)

    def _cuda_threads(self) -> Any:
        """The one thread count a CUDA trainer is planned with: the start's (its threads enter
        no rate, and a change of them alone would hand the GMIs over for nothing)."""
        choices = self.choices.get("trainer_threads", ())
        start = self.defaults.get("trainer_threads")
        return start if start in choices or not choices else min(choices)

    def _cost(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        kinds = change_kinds(self.applies, a, b)
        return max((self.costs.get(k, 0.0) for k in kinds), default=0.0)

    def _named(
        self, hold: dict[str, Any], tried: set[str], failed: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The incumbent ``hold`` with one named knob the model does not describe moved to a
        value not measured, failed or pruned with the rest of ``hold`` yet, nor refused with
        any config of the ``failed`` (None: no such value left)."""
        for name in self.named:
            refused = {c.get(name) for c in failed} - {hold[name]}
            for value in self.choices[name]:
                c = {**hold, name: value}
                fresh = self._key(c) not in tried and value not in refused
                if fresh and (not self.limits or fits(c, self.limits)):
                    return c
        return None

    def plan(self, study: optuna.Study) -> dict[str, Any]:
        """The next config's values (see the module docstring)."""
        windows, by_config = self._measured(study)
        self.costs = change_costs(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        machine = machine_within(self.machine, self.limits)  # a daemon's budget, if any
        medians = {k: float(np.median(v)) for k, v in by_config.items()}
        best_key = max(medians, key=medians.get) if medians else None
        incumbent = json.loads(best_key) if best_key else dict(self.defaults)
        hold = {
            n: nearest(incumbent.get(n, self.defaults.get(n)), self.choices[n])
            for n in self.choices
        }
        failed = [{**self.defaults, **json.loads(k)} for k in failed_configs(study)]
        pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
        tried = set(by_config) | {self._key(w.values) for w in windows}
        tried |= {self._key(c) for c in failed + [{**self.defaults, **t.params} for t in pruned]}
        named = self._named(hold, tried, failed) if best_key else None
        if named is not None:
            self.last = {"windows": len(windows), "incumbent": incumbent, "chosen": "named"}
            return named
        windows = [w for w in windows if all(w.values.get(n) == hold[n] for n in self.named)]
        params, sigma = fit(machine, windows, self.defaults)
        cands = self._candidates(hold)
        x = features(cands, self.defaults)
        pred = evaluate(machine, params, x)
        value = pred.steps_per_s if self.objective == "steps_per_s" else pred.steps_per_joule
        if self.objective == "goodput_per_joule":
            value = value * goodput_factor(study, cands, self.defaults)
        if self.objective == "weighted":  # relative to the window the tuner rates by
            ref = first_window(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            if ref is None:  # none measured yet: the incumbent's (the start's) prediction
                at = evaluate(machine, params, features([hold], self.defaults))
                ref = (float(at.steps_per_s[0]), float(at.steps_per_joule[0]))
            value = weighted(self.weight, pred.steps_per_s, pred.steps_per_joule, ref)
        mu = np.log(np.maximum(value, 1e-12))
        seen = features([w.values for w in windows], self.defaults) if windows else None
        dist = distance(x, seen) if seen is not None else np.full(len(cands), np.inf)
        sd = uncertainty(sigma, dist)
        keys = [self._key(c) for c in cands]
        ok = np.array([k not in tried for k in keys])
        ok &= fits_cores(machine, x)  # no core oversubscribed
        if self.limits:  # the daemon's budget for this job
            ok &= np.array([fits({**self.defaults, **c}, self.limits) for c in cands], dtype=bool)
        if self.lag_ceiling is not None:
            ok &= pred.lag <= self.lag_ceiling
        y_best = math.log(max(medians[best_key], 1e-12)) if best_key else float(np.max(mu))
        measured_s = sum(
            t.user_attrs.get("window_s", 0.0) for t in study.get_trials(deepcopy=False)
        )
        cautious = measured_s >= self.caution_after_s and best_key is not None
        if cautious:
            ok &= (mu >= y_best + math.log(self.caution)) | (sd > self.unsure)
        cost = np.array([self._cost(incumbent, c) for c in cands])
        gain = net_gain(mu, sd, y_best if best_key else None, cost, self.horizon_s, self.window_s)
        score = np.where(ok, gain, -np.inf)
        i = int(np.argmax(score))
        self.last = {
            "windows": len(windows),
            "sigma": sigma,
            "params": params,
            "incumbent": incumbent,
            "candidates": int(ok.sum()),
            "cautious": cautious,
        }
        if not np.isfinite(score[i]) or score[i] < self.min_gain:
            self.last["chosen"] = "incumbent"
            return hold if best_key is None else incumbent
        ei = float(expected_improvement(mu[i : i + 1], sd[i : i + 1], y_best)[0])
        self.last.update(chosen="model", predicted=float(np.exp(mu[i])), sd=float(sd[i]), ei=ei)
        return cands[i]


def nearest(value: Any, choices: Any) -> Any:
    """``value`` where it is one of ``choices``, else the nearest of them (the smaller of two as
    near: fewer cores), else the first: the plan keeps every knob it does not move inside its
    choices, so Optuna never draws one at random, past the budget and the cores."""
    choices = tuple(choices)
    if value in choices or not choices:
        return value
    numbers = [c for c in choices if isinstance(c, int | float) and not isinstance(c, bool)]
    if isinstance(value, int | float) and not isinstance(value, bool) and numbers:
        return min(numbers, key=lambda c: (abs(c - value), c))
    return choices[0]


def sampler_for(
    machine: MachineModel,
    space: dict[str, Any],
    defaults: dict[str, Any],
    settings: TunerSettings,
    seed: int | None,
) -> ModelSampler:
    """The model sampler over the online knobs of ``space`` (``autotune.tuning.knobs``), for
    the tuner's ``settings`` (its objective, lag ceiling and windows)."""
    online = [k for k in space.values() if k.online]
    return ModelSampler(
        machine,
        {k.name: k.choices for k in online},
        defaults,
        {k.name: k.apply for k in online},
        objective=settings.objective,
        lag_ceiling=settings.max_policy_lag,
        seed=seed,
        window_s=settings.window_s,
        weight=settings.weight,
    )
