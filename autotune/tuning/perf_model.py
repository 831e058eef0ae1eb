"""A throughput and power model of a training job, primed by probes and fitted online.

For a config (actors ``A``, envs per actor ``E``, batch ``B``, trainer device, trainers ``G``,
MPS share ``P``, trainer threads ``H``) on a machine of ``C`` cores, with rollout length ``L``:

* **Sampling** (actors): one actor round steps ``E`` envs and runs one policy forward,
  ``E * t_env + f0 + f1 * E`` seconds alone, moving toward the probes' loaded round
  ``g0 + g1 * E`` (an actor on every core) by ``min(1, demand / C)`` as the cores fill. On an
  H200 16-core host with Humanoid-v5's 400:200:100 policy the loaded round measured 0.29 ms
  plus 0.35 ms per env, so 8 envs per actor should lose about 8 % to 64; runs lost up to 24 %
  (24.5k against 32.1k trained steps/s, batches of 16,384 and 65,536), most of it waiting for
  receipts (the result's ``actor_waits``, which count the trainer's start too; the timeline's
  ``actor_throttle_s`` puts them under 0.3 % inside windows at 32-64 envs). The actors
  together sample
  ``k_S * A * E / round * squeeze * pipe`` steps/s, where ``squeeze = min(1, C / demand)``
  shares the cores out once actors, trainer threads and the stages ask for more than there
  are, and ``pipe = min(1, (1 + n) / 3)`` is what the in-flight budget leaves of it: an actor
  may have ``n = max(1, I * B / (A * E * L))`` rollouts not yet handed to a trainer
  (``TrainConfig.inflight_steps_per_actor``, ``I`` batches in flight: 2 by default). With fewer
  than two it waits for receipts between rollouts. On Humanoid-v5 (H100 host, 15 actors,
  batches of 8,192, two runs of one day), 16 envs per actor (n = 2.1) trained 32.2k steps/s,
  32 envs (n = 1.07) 21.8k: the form is fitted to that one pair, and the host's raw stepping
  rate moved by up to 30 % between runs that day, so part of the gap may be the host's.
* **Training** (trainers): one update of ``B`` samples takes ``c0 + c1 * B`` seconds on the
  device (the learner probe's line; on CUDA with ``G > 1`` the group's eager line,
  ``GROUP_LEARNER``, where the probes have one), split over ``G`` trainers; a GMI limited to
  ``P`` of the SMs runs at ``min(1, P / (q * G))`` of its speed, ``q`` the share past which
  the learner stops gaining (GMI-DRL's saturation); ``k_T`` scales the device's line to what
  windows measure.
* **Trained steps/s**: a soft minimum of the two rates (the pipeline backs the faster side up).
* **Watts**: the GPU's idle draw (measured whole, as NVML counts it), plus ``gpu_ctx`` while a
  trainer holds a context and ``gpu_dyn`` times its busy share; the CPU's idle draw plus
  ``w_core`` per busy core (actors busy while they sample, trainer threads while they train,
  ``STAGE_CORES`` of stages), scaled by ``k_cpu``.
* **Policy lag** (versions): ``k_lag * (A * E * L + 2 * B) / B`` (what is in flight, in
  batches, as the actors keep a rollout each and the pipeline two batches).
* **On a Ray cluster** (``nodes``): the actors are placed on the nodes as the launcher places
  them, and each node's sample at its own busy share, speed and round trip
  (``autotune.tuning.node_model``); actors on other hosts count their own busy cores, and the
  steps on the wire from them add to the lag.

``fit`` first sets each node's speed from the windows' per-node sampled steps, then moves the
multipliers (``k_S``, ``k_T`` per device, ``q``, ``gpu_ctx``, ``gpu_dyn``,
``k_cpu``) to the windows measured so far, by least squares on log rates and log watts with a
prior that keeps them near the probes' values, as Pollux and Optimus fit step-time models from a
handful of observed configs. ``predict`` gives, for many configs at once, steps/s, watts, steps/J,
the lag, and the uncertainty of log steps/J: the fit's residual spread, growing with the distance
to the nearest measured config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autotune.tuning.node_model import NodeModel, fit_node_speeds, node_rates
from runtime.config import TrainConfig
from runtime.learner_probe import GROUP_LEARNER

FEATURES = ("actors", "envs_per_actor", "batch_size", "cuda", "trainers", "mps", "threads")
STAGE_CORES = 0.25
"""Cores the four stages and the runner keep busy: on an H200 16-core host training Humanoid-v5 at
22k steps/s, the compressor 9.5 %, the migrator 6.4 % and the runner 1.7 % of a core
(docs/results/tuning/graphs-h200/cpu.txt)."""
CUDA_TRAINER_CORES = 0.3
"""Host CPU a trainer on a GPU keeps busy (it mostly waits on the GPU)."""
SOFTMIN_N = 4.0
PRIOR_SD = 0.4
"""Prior spread of a log multiplier (a window can move it by about e^0.4 before the prior
pushes back)."""
U0_SD = 1.2
"""Prior spread of the log per-batch overhead (it is not probed, so it is wide)."""
NOISE_SD = 0.08
"""Assumed spread of one window's log rate (its measurement noise)."""
SIGMA0 = 0.2
"""Uncertainty of log steps/J with no window measured."""
SIGMA_PER_STEP = 0.04
"""Growth of the uncertainty per doubling (or categorical change) away from measured configs."""


@dataclass(frozen=True)
class MachineModel:
    """The machine's and workload's fixed facts, from the probes and the hardware."""

    cores: int
    rollout_len: int
    t_env: float
    """CPU seconds per env step."""
    f0: float
    """Seconds per policy forward, fixed part."""
    f1: float
    """Seconds per policy forward, per env."""
    learner: dict[str, tuple[float, float]]
    """Per device (``cpu``, ``cuda``): (seconds per update, seconds per sample)."""
    gpu_idle_w: float = 0.0
    """The GPUs' draw with no context (0 without a GPU)."""
    gpu_limit_w: float = 0.0
    """The GPU's power limit (priors of the context and busy draws)."""
    cpu_idle_w: float = 0.0
    w_core: float = 10.0
    gpu_ctx_w: float = 0.0
    """Measured: what an open context adds to the GPU's idle draw (0: not measured)."""
    gpu_busy_w: float = 0.0
    """Measured: what the learner updating back to back adds to that (0: not measured)."""
    load: float = 1.0
    """CPU work's slow-down with every core busy (the probes' loaded / idle env step, >= 1);
    used where the loaded round (``g0``, ``g1``) was not measured."""
    g0: float = 0.0
    """Measured: seconds per actor round, fixed part, with an actor on every core (0: not)."""
    g1: float = 0.0
    """Measured: seconds per actor round, per env, with an actor on every core (0: not)."""
    nodes: tuple[NodeModel, ...] = ()
    """With ``--cluster``: the Ray nodes the actors are placed on (``autotune.tuning.
    node_model``); ``cores`` is then this host's alone. Empty: every actor is a process here."""
    inflight_batches: float = TrainConfig.max_inflight_batches
    """The run's ``max_inflight_batches`` (``--max-inflight-batches``)."""

    def actor_cpus(self) -> int:
        """The most actors that can run at once: the nodes' CPUs, or this machine's cores."""
        return int(sum(n.cpus for n in self.nodes)) if self.nodes else self.cores


@dataclass(frozen=True)
class Params:
    """What ``fit`` moves (see the module docstring)."""

    k_s: float = 0.85
    k_t: dict[str, float] = field(default_factory=lambda: {"cpu": 1.0, "cuda": 1.0})
    q: float = 0.3
    gpu_ctx: float = 0.0
    gpu_dyn: float = 0.0
    k_cpu: float = 1.0
    k_lag: float = 1.0
    u0: float = 0.03
    """Seconds per batch the pipeline adds to an update (the batcher assembling it, the new
    weights going out to the actors); a prior, fitted from windows where training bounds."""
    node_speed: dict[str, float] = field(default_factory=dict)
    """Per Ray node (by name): its actors' speed relative to the probe's (1 unless fitted)."""


def charged_share(m: MachineModel, gpu: float, cpu: float) -> MachineModel:
    """The model of a job charged ``gpu`` of the GPU's draw at rest (idle and an open context)
    and ``cpu`` of the CPU packages' idle draw, as a job that shares the machine is metered
    (``runtime.energy.shares``); its own busy cores and its learner's draw stay whole."""
    ctx = m.gpu_ctx_w if m.gpu_ctx_w > 0 else 0.08 * m.gpu_limit_w
    return replace(
        m, gpu_idle_w=m.gpu_idle_w * gpu, gpu_ctx_w=ctx * gpu, cpu_idle_w=m.cpu_idle_w * cpu
    )


def prior_params(m: MachineModel) -> Params:
    """Multipliers before any window: the GPU's context and busy draws as the probes measured
    them, else as shares of its power limit (an H100's 700 W gives 56 W and 140 W)."""
    return Params(
        gpu_ctx=m.gpu_ctx_w if m.gpu_ctx_w > 0 else 0.08 * m.gpu_limit_w,
        gpu_dyn=m.gpu_busy_w if m.gpu_busy_w > 0 else 0.2 * m.gpu_limit_w,
    )


def features(configs: list[dict[str, Any]], defaults: dict[str, Any]) -> dict[str, np.ndarray]:
    """Configs (knob values, the rest from ``defaults``) as feature arrays."""

    def col(name: str, fn=float) -> np.ndarray:
        return np.array([fn(c.get(name, defaults.get(name))) for c in configs], float)

    mps = [c.get("mps_pct", defaults.get("mps_pct", 100)) for c in configs]
    cuda = col("trainer_device", lambda d: d == "cuda")
    return {
        "actors": col("actors"),
        "envs_per_actor": col("envs_per_actor"),
        "batch_size": col("batch_size"),
        "cuda": cuda,
        "trainers": col("trainers"),
        "mps": np.array([(100 if p is None else p) / 100.0 for p in mps], float),
        # a CUDA trainer's threads enter no rate (``trainer_cores``): held at 1, so a thread
        # count alone puts a CUDA config no farther from the measured ones
        "threads": np.where(cuda, 1.0, col("trainer_threads")),
    }


@dataclass
class Prediction:
    steps_per_s: np.ndarray
    sample_rate: np.ndarray
    train_rate: np.ndarray
    gpu_w: np.ndarray
    cpu_w: np.ndarray
    lag: np.ndarray
    node_sample: np.ndarray | None = None
    """With nodes: each node's actors' sampled steps/s at the predicted rate (configs x nodes)."""

    @property
    def watts(self) -> np.ndarray:
        return self.gpu_w + self.cpu_w

    @property
    def steps_per_joule(self) -> np.ndarray:
        return self.steps_per_s / np.maximum(self.watts, 1e-9)


def trainer_cores(x: dict[str, np.ndarray]) -> np.ndarray:
    """Cores the trainers keep busy when training flat out."""
    return np.where(x["cuda"] > 0, CUDA_TRAINER_CORES * x["trainers"], x["trainers"] * x["threads"])


def actor_round(m: MachineModel, e: np.ndarray, busy_share: np.ndarray) -> np.ndarray:
    """Seconds of one actor round of ``e`` envs, moving toward the loaded round as the cores
    fill (``busy_share``). The loaded round is taken as its probe measured it, at two env
    counts, even where it comes out cheaper than ``e`` single-env steps: an EnvPool step of one
    env carries the call's whole overhead, which many envs per call share (HalfCheetah-v5 on an
    H200 host: 124 us for one env alone, 77 us per env of 16 with every core stepping; with
    the idle line as a floor the model put 16 actors of 64 envs at 105k steps/s, the loaded
    line at 162k, and the run trained 207k)."""
    round_s = e * m.t_env + m.f0 + m.f1 * e
    if m.g1 > 0:  # toward the loaded round as the cores fill
        return round_s + (m.g0 + m.g1 * e - round_s) * busy_share
    return round_s * (1.0 + (m.load - 1.0) * busy_share)


def evaluate(m: MachineModel, p: Params, x: dict[str, np.ndarray]) -> Prediction:
    """The model at configs ``x`` (``features``)."""
    a, e, b = x["actors"], x["envs_per_actor"], x["batch_size"]
    cuda, g, share, h = x["cuda"] > 0, x["trainers"], x["mps"], x["threads"]
    tc = trainer_cores(x)

    def head(actors_here: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        demand = actors_here + tc + STAGE_CORES
        return np.minimum(1.0, m.cores / demand), np.minimum(1.0, demand / m.cores)

    rollouts = np.maximum(1.0, m.inflight_batches * b / (a * e * m.rollout_len))
    pipe = np.minimum(1.0, (1.0 + rollouts) / 3.0)
    nodes = None
    if m.nodes:
        rnd = lambda busy: actor_round(m, e, busy)  # noqa: E731
        nodes = node_rates(m.nodes, p.node_speed, a, e, rnd, head, rollouts, m.rollout_len)
        squeeze, _ = head(nodes.head_actors)
        sample = np.maximum(p.k_s * nodes.total * pipe, 1e-9)
        here, running = nodes.head_actors, nodes.running
    else:
        squeeze, busy_share = head(a)
        sample = p.k_s * a * e / actor_round(m, e, busy_share) * squeeze * pipe
        here = running = a
    c0c, c1c = m.learner.get("cuda", (1.0, 1.0))
    c0g, c1g = m.learner.get(GROUP_LEARNER, (c0c, c1c))  # older probes: the single line
    c0c, c1c = np.where(g > 1, c0g, c0c), np.where(g > 1, c1g, c1c)
    c0p, c1p = m.learner.get("cpu", (1.0, 1.0))
    gpu_speed = np.minimum(1.0, share / (p.q * g)) * p.k_t.get("cuda", 1.0)
    upd_gpu = (c0c + c1c * b / g) / gpu_speed + 0.002 * (g - 1) + p.u0
    cpu_speed = g * h**0.7 * squeeze * p.k_t.get("cpu", 1.0)
    upd_cpu = c0p + c1p * b / cpu_speed + 0.002 * (g - 1) + p.u0
    train = b / np.where(cuda, upd_gpu, upd_cpu)
    rate = (sample**-SOFTMIN_N + train**-SOFTMIN_N) ** (-1.0 / SOFTMIN_N)
    busy_actors = np.minimum(here, m.cores) * squeeze * rate / sample
    busy_train = tc * squeeze * rate / train
    busy = np.minimum(m.cores, busy_actors + busy_train + STAGE_CORES * squeeze)
    in_flight = running * e * m.rollout_len + 2 * b
    node_sample = None
    if nodes is not None:  # actors on other hosts: their cores and the steps on the wire
        used = rate / np.maximum(nodes.total, 1e-9)
        busy = busy + (running - here) * rate / sample
        in_flight = in_flight + nodes.wire_steps * used
        node_sample = nodes.sample * used[:, None]
    cpu_w = (m.cpu_idle_w + m.w_core * busy) * p.k_cpu
    gpu_busy = np.where(cuda, rate / train, 0.0)
    gpu_w = m.gpu_idle_w + np.where(cuda, p.gpu_ctx + p.gpu_dyn * gpu_busy * (0.5 + 0.5 * share), 0)
    lag = p.k_lag * in_flight / b
    return Prediction(rate, sample, train, gpu_w, cpu_w, lag, node_sample)


@dataclass(frozen=True)
class Window:
    """One measured window of one config."""

    values: dict[str, Any]
    steps_per_s: float
    gpu_w: float
    cpu_w: float
    lag: float
    node_rates: dict[str, float] | None = None
    """Sampled steps/s per Ray node, by name (None: no cluster, or not reported)."""


def _unpack(v: np.ndarray, base: Params, devices: list[str]) -> Params:
    k_t = dict(base.k_t)
    for i, d in enumerate(devices):
        k_t[d] = base.k_t.get(d, 1.0) * math.exp(v[1 + i])
    j = 1 + len(devices)
    return replace(
        base,
        k_s=base.k_s * math.exp(v[0]),
        k_t=k_t,
        q=min(1.0, base.q * math.exp(v[j])),
        gpu_ctx=base.gpu_ctx * math.exp(v[j + 1]),
        gpu_dyn=base.gpu_dyn * math.exp(v[j + 2]),
        k_cpu=base.k_cpu * math.exp(v[j + 3]),
        u0=base.u0 * math.exp(U0_SD / PRIOR_SD * v[j + 4]),
    )


def fit(
    m: MachineModel, windows: list[Window], defaults: dict[str, Any], base: Params | None = None
) -> tuple[Params, float]:
    """Params fitted to ``windows`` (least squares on log rates and log watts, with the prior
    ``base``), and the residual spread of log steps/J."""
    base = base or prior_params(m)
    if not windows:
        return base, SIGMA0
    x = features([w.values for w in windows], defaults)
    if m.nodes and any(w.node_rates for w in windows):  # the nodes' relative speeds first
        per_node = evaluate(m, base, x).node_sample
        speeds = fit_node_speeds(
            m.nodes, per_node, [w.node_rates for w in windows], base.node_speed
        )
        base = replace(base, node_speed=speeds)
    r_obs = np.log(np.maximum([w.steps_per_s for w in windows], 1e-9))
    g_obs = np.array([w.gpu_w for w in windows])
    c_obs = np.log(np.maximum([w.cpu_w for w in windows], 1e-9))
    devices = sorted({"cuda" if c else "cpu" for c in x["cuda"]})
    has_gpu_w = m.gpu_limit_w > 0

    def loss(v: np.ndarray) -> float:
        pr = evaluate(m, _unpack(v, base, devices), x)
        out = np.sum((np.log(pr.steps_per_s) - r_obs) ** 2) / NOISE_SD**2
        out += np.sum((np.log(pr.cpu_w) - c_obs) ** 2) / NOISE_SD**2
        if has_gpu_w:
            out += (
                np.sum((np.log(np.maximum(pr.gpu_w, 1e-9)) - np.log(np.maximum(g_obs, 1e-9))) ** 2)
                / NOISE_SD**2
            )
        return float(out + np.sum(v**2) / PRIOR_SD**2)

    v = nelder_mead(loss, np.zeros(6 + len(devices)))
    params = _unpack(v, base, devices)
    pr = evaluate(m, params, x)
    lag_obs = np.array([w.lag for w in windows])
    ok = lag_obs > 0
    if ok.any():
        k_lag = float(np.exp(np.mean(np.log(lag_obs[ok] / pr.lag[ok]))))
        params = replace(params, k_lag=params.k_lag * k_lag)
    spj_obs = r_obs - np.log(np.maximum(g_obs + np.exp(c_obs), 1e-9))
    res = np.log(pr.steps_per_joule) - spj_obs
    n0 = 2.0
    sigma = math.sqrt((float(np.sum(res**2)) + n0 * NOISE_SD**2) / (len(windows) + n0))
    return params, sigma


def distance(x: dict[str, np.ndarray], measured: dict[str, np.ndarray]) -> np.ndarray:
    """Per config in ``x``, the distance to the nearest config in ``measured``: doublings of
    the numeric knobs, actors two at a time (their effect turns sharply at the core count),
    plus one per categorical change (device, trainer count)."""
    if not len(measured["actors"]):
        return np.full(len(x["actors"]), np.inf)
    out = np.zeros((len(x["actors"]), len(measured["actors"])))
    out += np.abs(x["actors"][:, None] - measured["actors"][None, :]) / 2.0
    for name in ("envs_per_actor", "batch_size", "mps", "threads"):
        out += np.abs(np.log2(x[name][:, None]) - np.log2(measured[name][None, :]))
    out += (x["cuda"][:, None] != measured["cuda"][None, :]) * 1.0
    out += (x["trainers"][:, None] != measured["trainers"][None, :]) * 1.0
    return out.min(axis=1)


def uncertainty(sigma: float, dist: np.ndarray) -> np.ndarray:
    """The spread of log steps/J at configs this far from measured ones."""
    d = np.where(np.isfinite(dist), dist, 0.0)
    base = np.where(np.isfinite(dist), sigma, SIGMA0 * 2)
    return np.sqrt(base**2 + (SIGMA_PER_STEP * d) ** 2)


def nelder_mead(fn, x0: np.ndarray, step: float = 0.3, iters: int = 400) -> np.ndarray:
    """Minimises ``fn`` from ``x0`` (the simplex method; enough for a few parameters)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [fn(s) for s in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-6 * (1 + abs(vals[0])):
            break
        centre = np.mean(simplex[:-1], axis=0)
        refl = centre + (centre - simplex[-1])
        fr = fn(refl)
        if fr < vals[0]:
            exp = centre + 2 * (centre - simplex[-1])
            fe = fn(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = centre + 0.5 * (simplex[-1] - centre)
            fc = fn(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (s - best) for s in simplex]
                vals = [fn(s) for s in simplex]
    return simplex[int(np.argmin(vals))]
