"""The configuration of one training run, validated before any process starts."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from policies.appo import APPOConfig
from runtime.envs import EnvInfo

TRAINER_DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """One or more invalid settings; the message lists every problem and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; ``validate`` checks it against the environment too."""

    env: str = "CartPole-v1"
    """Gymnasium environment id."""
    steps: int = 200_000
    """Trained environment steps after which the run drains and stops."""
    actors: int = 2
    """Actor processes, each stepping ``envs_per_actor`` environments."""
    envs_per_actor: int = 8
    """Environments per actor, stepped as one batch for policy inference."""
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
    """torch threads in the trainer process."""
    max_wall_s: float | None = None
    """Stop (with a clean drain) after this many seconds even if ``steps`` is not reached."""
    max_inflight_batches: float = 2.0
    """Back-pressure: experience sent but not yet received by the trainer, in batches, shared
    among the actors (each keeps at least one rollout in flight)."""
    transport: str = "ipc"
    """``ipc`` (Unix sockets in a private temp dir) or ``tcp`` (loopback)."""
    learner: APPOConfig = field(default_factory=APPOConfig)
    """Learner hyper-parameters."""

    def problems(self) -> list[str]:
        """Every invalid setting that can be judged without making the environment."""
        out = []
        for name in ("steps", "actors", "envs_per_actor", "rollout_len", "batch_size",
                     "chunk_bytes", "trainer_threads"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                out.append(f"{name}={value!r}: must be an integer >= 1")
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
        if not self.max_inflight_batches > 0:
            out.append(f"max_inflight_batches={self.max_inflight_batches!r}: must be > 0")
        if not self.chunk_timeout_s > 0:
            out.append(f"chunk_timeout_s={self.chunk_timeout_s!r}: must be > 0")
        if self.trainer_device not in TRAINER_DEVICES:
            out.append(f"trainer_device={self.trainer_device!r}: allowed {TRAINER_DEVICES}")
        if self.transport not in ("ipc", "tcp"):
            out.append(f"transport={self.transport!r}: allowed 'ipc' or 'tcp'")
        if self.max_wall_s is not None and not self.max_wall_s > 0:
            out.append(f"max_wall_s={self.max_wall_s!r}: must be > 0 (or unset)")
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
        from policies.mlp import PolicySpecError, parse_spec
        from runtime.envs import EnvError, probe_env

        try:
            info = probe_env(self.env)
        except EnvError as exc:
            raise ConfigError([str(exc)]) from None
        try:
            parse_spec(self.policy, info.obs_dim, info.act_dim)
        except PolicySpecError as exc:
            raise ConfigError([str(exc)]) from None
        if self.trainer_device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(["trainer_device='cuda' but CUDA is not available here"])
        return info

    def inflight_steps_per_actor(self) -> int:
        """Each actor's share of the in-flight budget, at least one rollout."""
        share = self.max_inflight_batches * self.batch_size / self.actors
        rollout = self.envs_per_actor * self.rollout_len
        return max(rollout, int(share))

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON output (the learner as a nested dict)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, APPOConfig) else value
        return out
