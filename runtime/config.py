"""The configuration of one training run, validated before any process starts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from policies.appo_config import APPOConfig, finite_number
from runtime.env_backends import BACKENDS, resolve_backend
from runtime.envs import EnvError, EnvInfo, probe_env, use_env_modules
from runtime.frame_limits import CHUNK_MAX_BYTES, rollout_problem
from runtime.link_settings import link_check, link_problems

TRAINER_DEVICES = ("auto", "cpu", "cuda")
TRAINER_PRECISIONS = ("fp32", "bf16")
GRAD_SYNCS = ("auto", "mpr", "mrr", "har")
INFERENCES = ("actor", "gmi")
ACTOR_NICE_MAX = 19  # the largest niceness an unprivileged process can add (nice(2))
SEED_MAX = 2**63 - 1  # torch seeds its generators with a signed 64-bit number


class ConfigError(ValueError):
    """One or more invalid settings; the message lists every problem and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n  - " + "\n  - ".join(problems))


def mps_pct_problem(pct: object, gmis: int | None) -> str | None:
    """What is wrong with MPS percentages ``pct`` for ``gmis`` GMIs (None: skip the count),
    or None if they are fine: one value for all GMIs or one per GMI, each an int in 1..100."""
    whole = isinstance(pct, tuple) and all(
        isinstance(p, int) and not isinstance(p, bool) for p in pct
    )
    if not (whole and pct and all(1 <= p <= 100 for p in pct)):
        return f"{pct!r}: each value must be an integer in 1..100"
    if gmis is not None and len(pct) not in (1, gmis):
        return f"{len(pct)} values for {gmis} GMIs; give one value or {gmis} (one per GMI)"
    return None


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; ``validate`` checks it against the environment too."""

    env: str = "CartPole-v1"
    """Gymnasium environment id (``module:EnvId`` imports ``module`` first, as gymnasium does,
    in every process, from the directory the run started in)."""
    env_modules: tuple[str, ...] = ()
    """Modules imported in every process of the run before an env is made: custom envs that
    register themselves with gymnasium (``runtime.envs.use_env_modules``)."""
    env_backend: str = "auto"
    """How actors step their envs (``runtime.env_backends``): ``gymnasium``, ``envpool``, or
    ``auto`` (EnvPool where it is installed and has the id; a custom env uses gymnasium)."""
    steps: int = 200_000
    """Trained environment steps after which the run drains and stops."""
    actors: int = 2
    """Actor processes, each stepping ``envs_per_actor`` environments."""
    envs_per_actor: int = 8
    """Environments per actor, stepped as one batch for policy inference."""
    actor_nice: int = 0
    """Niceness the actors add to their own (``os.nice``, 0..19): with as many actors as cores,
    a positive value lets the pipeline stages and the trainer run as soon as they have work
    instead of waiting for an actor's time slice."""
    pin_actors: bool | None = None
    """Pin actor slot i to the i-th core (or block of cores) of the run's CPU set where actors
    are no more than its cores (``runtime.actor_placement.actor_cores``); None: only where that set
    is narrower than the machine's (a daemon's budget: cores the run owns)."""
    rollout_len: int = 32
    """Steps per environment in one rollout (the trajectory length the learner sees)."""
    batch_size: int = 1024
    """Environment steps per training batch; a multiple of ``rollout_len``."""
    policy: str = "auto"
    """MLP spec such as ``60:256:128:64:8``; ``auto`` for the environment's sizes."""
    seed: int = 0
    """Seeds the policy initialisation and the environments."""
    chunk_bytes: int = 256 * 1024
    """Compressor: flush a chunk once its channels hold this many bytes."""
    chunk_timeout_s: float = 0.02
    """Compressor: flush a non-empty chunk after this long even if it is small."""
    trainer_device: str = "auto"
    """``cuda`` when a GPU is present (``auto``), or forced ``cpu`` / ``cuda``."""
    trainer_threads: int = 1
    """torch threads in each trainer GMI process."""
    trainer_precision: str = "fp32"
    """``fp32``, or ``bf16``: the trainer's hidden-layer matmuls run in bfloat16 under
    ``torch.autocast`` (output layers, weights, optimiser, log-probs, V-trace and losses stay
    float32); about 2x the update rate of a CPU trainer with bfloat16 instructions."""
    trainers: int = 1
    """Trainer GMIs per GPU (per listed GPU), or trainer processes on the CPU; data-parallel,
    gradients averaged with the strategy the layout selects (``runtime.gmi.grad_sync``)."""
    mps_pct: tuple[int, ...] | None = None
    """MPS active-thread percentage: one value for every GMI or one per GMI (GPU-major order);
    None runs GMIs without an MPS limit (and without MPS when there is one GMI per GPU)."""
    gpus: tuple[int, ...] | None = None
    """CUDA device indices the trainer GMIs use; None means GPU 0."""
    grad_sync: str = "auto"
    """Gradient sync among GMIs: ``auto`` (GMI-DRL Algorithm 1 from the layout), or forced
    ``mpr`` (one all-reduce through the host), ``mrr`` (rings, NCCL between GPUs; needs the
    same GMI count on every GPU) or ``har`` (hierarchical)."""
    inference: str = "actor"
    """Where the policy picks actions: ``actor`` (each actor runs it on its own CPU core) or
    ``gmi`` (one batched inference GMI on the trainer device, SEED RL-style: actors send
    observations and step their environments in two halves while the other half waits)."""
    inference_mps_pct: int | None = None
    """MPS active-thread percentage of the inference GMI on a GPU (None: no limit)."""
    max_wall_s: float | None = None
    """Stop (with a clean drain) after this many seconds even if ``steps`` is not reached."""
    target_return: float | None = None
    """Stop (with a clean drain) at the first 100-episode mean return of at least this
    (``runtime.target``); the result says what it took to get there."""
    max_inflight_batches: float = 2.0
    """Back-pressure: experience sent but not yet received by the trainer, in batches, shared
    among the actors (each keeps at least one rollout in flight)."""
    transport: str = "ipc"
    """``ipc`` (Unix sockets in a private temp dir) or ``tcp`` (on ``bind_host``, every link
    served with CURVE and keys made for the run: ``runtime.curve``)."""
    bind_host: str = "127.0.0.1"
    """With ``transport='tcp'``: the IP address of this machine the run's links bind (loopback
    by default; 0.0.0.0 or :: listens on every interface, only when named)."""
    cluster: str | None = None
    """Actors placed on a Ray cluster's nodes (``runtime.cluster``): ``auto``, ``ray://HOST:PORT``
    or ``local:N``; needs ``transport='tcp'``. None: actors are this machine's processes."""
    checkpoint: str | None = None
    """Directory of the learner's state across runs (``runtime.checkpoint``): loaded at the start
    when it holds one (``steps`` then counts every run's trained steps), written every
    ``checkpoint_every_s`` and when the run ends; None keeps no state."""
    checkpoint_every_s: float = 300.0
    """With ``checkpoint``: seconds between saves while the run trains (each save whole, then
    renamed), so a run that dies keeps what it had trained by its last save."""
    cpu_idle_w: float | None = None
    """Idle power of the CPU packages in watts, charged per second of the run by the CPU energy
    model where RAPL cannot be read (``runtime.energy.cpu_idle``); None takes it from the CPU's
    TDP (CodeCarbon's table), or a per-core figure for a CPU the table does not know."""
    learner: APPOConfig = field(default_factory=APPOConfig)
    """Learner hyper-parameters."""

    def problems(self) -> list[str]:
        """Every invalid setting that can be judged without making the environment."""
        out = []
        counts = ("steps", "actors", "envs_per_actor", "rollout_len", "batch_size", "chunk_bytes")
        least = dict.fromkeys((*counts, "trainer_threads", "trainers"), 1) | {"seed": 0}
        for name, lo in least.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                out.append(f"{name}={value!r}: must be an integer >= {lo}")
        if isinstance(self.seed, int) and self.seed > SEED_MAX:
            out.append(f"seed={self.seed}: at most {SEED_MAX} (2**63 - 1, as torch takes it)")
        if isinstance(self.chunk_bytes, int) and self.chunk_bytes > CHUNK_MAX_BYTES:
            out.append(f"chunk_bytes={self.chunk_bytes}: at most {CHUNK_MAX_BYTES} (256 MiB)")
        if isinstance(self.batch_size, int) and isinstance(self.rollout_len, int):
            if self.rollout_len >= 1 and self.batch_size % self.rollout_len:
                lo = max(self.rollout_len, self.batch_size // self.rollout_len * self.rollout_len)
                out.append(
                    f"batch_size={self.batch_size}: must be a multiple of rollout_len="
                    f"{self.rollout_len} (whole trajectories), e.g. {lo} or {lo + self.rollout_len}"
                )
            if isinstance(self.steps, int) and self.batch_size > self.steps >= 1:
                out.append(
                    f"batch_size={self.batch_size}: larger than steps={self.steps}, so no batch "
                    f"could ever arrive; allowed: rollout_len..steps ({self.rollout_len}.."
                    f"{self.steps})"
                )
        if problem := self.learner.batch_problem(self.batch_size, self.rollout_len):
            out.append(problem)
        nice = self.actor_nice
        if not isinstance(nice, int) or isinstance(nice, bool) or not 0 <= nice <= ACTOR_NICE_MAX:
            out.append(f"actor_nice={self.actor_nice!r}: allowed an integer 0..{ACTOR_NICE_MAX}")
        if self.pin_actors is not None and not isinstance(self.pin_actors, bool):
            out.append(f"pin_actors={self.pin_actors!r}: allowed True, False or None (auto)")
        for name in ("max_inflight_batches", "chunk_timeout_s"):
            if not finite_number(getattr(self, name), above=0.0):
                out.append(f"{name}={getattr(self, name)!r}: must be a finite number > 0")
        if self.env_backend not in BACKENDS:
            out.append(f"env_backend={self.env_backend!r}: allowed {BACKENDS}")
        if self.trainer_precision not in TRAINER_PRECISIONS:
            out.append(
                f"trainer_precision={self.trainer_precision!r}: allowed {TRAINER_PRECISIONS}"
            )
        if self.trainer_device not in TRAINER_DEVICES:
            out.append(f"trainer_device={self.trainer_device!r}: allowed {TRAINER_DEVICES}")
        out.extend(self._gmi_problems())
        out.extend(link_problems(self))
        if self.target_return is not None and not finite_number(self.target_return):
            out.append(f"target_return={self.target_return!r}: must be a finite number (or unset)")
        if self.max_wall_s is not None and not finite_number(self.max_wall_s, above=0.0):
            out.append(f"max_wall_s={self.max_wall_s!r}: must be a finite number > 0 (or unset)")
        if self.checkpoint is not None and not (
            isinstance(self.checkpoint, str) and self.checkpoint.strip()
        ):
            out.append(f"checkpoint={self.checkpoint!r}: must be a directory path (or unset)")
        if not (
            isinstance(self.checkpoint_every_s, (int, float))
            and math.isfinite(self.checkpoint_every_s)
            and self.checkpoint_every_s > 0
        ):
            out.append(f"checkpoint_every_s={self.checkpoint_every_s!r}: must be seconds > 0")
        if self.cpu_idle_w is not None and not (
            isinstance(self.cpu_idle_w, (int, float))
            and not isinstance(self.cpu_idle_w, bool)
            and math.isfinite(self.cpu_idle_w)
            and self.cpu_idle_w >= 0
        ):
            out.append(
                f"cpu_idle_w={self.cpu_idle_w!r}: allowed a number of watts >= 0 (the CPU "
                "packages' idle power), or unset to take it from the CPU's TDP"
            )
        bad = [m for m in self.env_modules if not all(p.isidentifier() for p in str(m).split("."))]
        if not isinstance(self.env_modules, tuple) or bad:
            out.append(
                f"env_modules={self.env_modules!r}: allowed a tuple of module names "
                "(dotted Python identifiers, e.g. my_envs or pkg.envs)"
            )
        out.extend(self.learner.problems())
        return out

    def validate(self) -> EnvInfo:
        """Checks every setting, then the environment and the policy spec against it.

        Returns:
            The environment's description.

        Raises:
            ConfigError: Listing every problem found.
        """
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        if why := link_check(self):
            raise ConfigError([why])
        info = self.check_workload()
        width = max(info.obs_dim, info.act_dim)
        if why := rollout_problem(self.envs_per_actor, self.rollout_len, width):
            raise ConfigError([why])
        device = self.resolved_device()
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(["trainer_device='cuda' but CUDA is not available here"])
            count = torch.cuda.device_count()
            bad = [g for g in self.gpu_list() if g >= count]
            if bad:
                raise ConfigError(
                    [
                        f"gpus={list(self.gpu_list())}: GPU(s) {bad} do not exist; "
                        f"this machine has CUDA devices 0..{count - 1}"
                    ]
                )
            if self.trainer_precision == "bf16":  # NVML: no CUDA context in this process
                # here, not at the top: pynvml stays out of the actors, which import this module
                from runtime.hw.gpus import bf16_problem, list_gpus

                problem = bf16_problem(list_gpus())
                if problem:
                    raise ConfigError([problem])
        elif (
            self.gpus is not None or self.mps_pct is not None or self.inference_mps_pct is not None
        ):
            raise ConfigError(
                [
                    "gpus, mps_pct and inference_mps_pct place GMIs on GPUs, but the trainer "
                    "device is cpu; drop them or use trainer_device='cuda'"
                ]
            )
        return info

    def check_workload(self) -> EnvInfo:
        """The environment's description, once the env exists and the policy spec fits it.

        Raises:
            ConfigError: naming the env or the spec entry that does not fit.
        """
        from policies.mlp import PolicySpecError, parse_spec  # imports torch

        try:
            use_env_modules(self.env_modules)
            info = probe_env(self.env, resolve_backend(self.env, self.env_backend))
        except EnvError as exc:
            raise ConfigError([str(exc)]) from None
        try:
            parse_spec(self.policy, info.obs_dim, info.act_dim)
        except PolicySpecError as exc:
            raise ConfigError([str(exc)]) from None
        return info

    def resolved_device(self) -> str:
        """The trainer device with ``auto`` resolved (``cuda`` when torch sees a GPU)."""
        if self.trainer_device != "auto":
            return self.trainer_device
        from runtime.hw.gpus import torch_sees_gpu

        return "cuda" if torch_sees_gpu() else "cpu"

    def as_run(self) -> TrainConfig:
        """This config as a run takes it: ``env_backend`` resolved (``auto`` -> the backend
        actors step), and, with ``learner.lr_scaling``, ``learner.lr_batch`` set to the
        batch size the run starts with unless given."""
        learner = self.learner
        if learner.lr_scaling != "none" and learner.lr_batch is None:
            learner = replace(learner, lr_batch=self.batch_size)
        return replace(self, env_backend=self.resolved_backend(), learner=learner)

    def resolved_backend(self) -> str:
        """The env backend with ``auto`` resolved (``runtime.env_backends.resolve_backend``).

        Raises:
            EnvError: as ``resolve_backend`` does.
        """
        return resolve_backend(self.env, self.env_backend)

    def gpu_list(self) -> tuple[int, ...]:
        """The GPUs the trainer GMIs use (GPU 0 when unset)."""
        return self.gpus if self.gpus is not None else (0,)

    def gmi_count(self) -> int:
        """Trainer GMIs in all: ``trainers`` per GPU, or ``trainers`` on the CPU."""
        return self.trainers * (len(self.gpu_list()) if self.resolved_device() == "cuda" else 1)

    def _gmi_problems(self) -> list[str]:
        out = []
        if self.grad_sync not in GRAD_SYNCS:
            out.append(f"grad_sync={self.grad_sync!r}: allowed {GRAD_SYNCS}")
        if self.gpus is not None:
            if (
                not isinstance(self.gpus, tuple)
                or not self.gpus
                or not all(
                    isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.gpus
                )
            ):
                out.append(f"gpus={self.gpus!r}: must be a non-empty tuple of GPU indices >= 0")
            elif len(set(self.gpus)) != len(self.gpus):
                out.append(f"gpus={list(self.gpus)}: lists a GPU twice; list each GPU once")
        if self.inference not in INFERENCES:
            out.append(f"inference={self.inference!r}: allowed {INFERENCES}")
        if self.inference_mps_pct is not None:
            problem = mps_pct_problem((self.inference_mps_pct,), None)
            if self.inference != "gmi":
                out.append(
                    f"inference_mps_pct={self.inference_mps_pct!r}: applies only with "
                    "inference='gmi'"
                )
            elif problem:
                out.append(f"inference_mps_pct: {problem}")
        if self.mps_pct is not None:
            trainers_ok = isinstance(self.trainers, int) and self.trainers >= 1 and not out
            n = self.trainers * len(self.gpu_list()) if trainers_ok else None
            problem = mps_pct_problem(self.mps_pct, n)
            if problem:
                out.append(f"mps_pct: {problem}")
        return out

    def inflight_steps_per_actor(self) -> int:
        """Each actor's share of the in-flight budget, at least one rollout."""
        share = self.max_inflight_batches * self.batch_size / self.actors
        rollout = self.envs_per_actor * self.rollout_len
        return max(rollout, int(share))

    @classmethod
    def from_dict(cls, doc: dict[str, object]) -> TrainConfig:
        """The config ``to_dict`` wrote (lists back to tuples, the learner from its mapping);
        missing fields take their defaults.

        Raises:
            ConfigError: unknown fields (named, with the allowed ones) or invalid values.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        learner = doc.get("learner", {})
        learner_names = {f.name for f in fields(APPOConfig)}
        problems = [f"unknown field {k!r}; allowed: {', '.join(sorted(names))}" for k in unknown]
        if not isinstance(learner, dict):
            problems.append(f"learner={learner!r}: must be a mapping of learner fields")
            learner = {}
        problems += [
            f"unknown learner field {k!r}; allowed: {', '.join(sorted(learner_names))}"
            for k in sorted(set(learner) - learner_names)
        ]
        if problems:
            raise ConfigError(problems)
        values = {k: v for k, v in doc.items() if k != "learner"}
        for name in ("mps_pct", "gpus", "env_modules"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        cfg = cls(**values, learner=APPOConfig(**learner))  # type: ignore[arg-type]
        bad = cfg.problems()
        if bad:
            raise ConfigError(bad)
        return cfg

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON output (the learner as a nested dict)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, APPOConfig) else value
        return out
