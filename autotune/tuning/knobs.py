"""The knob space the tuner searches: each knob's values, how it applies, and whether it applies
on this machine.

A knob is a ``TrainConfig`` field. ``apply`` says how a running job takes a new value
(``runtime.live``): ``live`` (actors, chunk and batch sizes), ``respawn`` (new actor
processes), ``handover`` (a new generation of trainer GMIs), or ``restart`` (a new run; the
online tuner leaves these at the job's value, ``autotune study`` tunes them). A knob that
cannot apply here (no GPU: no MPS percentage, no cuda trainer) is kept in the space with the
reason, so ``status`` can say why it is not tuned.

Users fix or narrow knobs with ``NAME=VALUE`` (fixed), ``NAME=LOW..HIGH`` (an integer range,
or the allowed choices between the two) or ``NAME=A,B,C`` (a subset of the choices).

Knobs in ``OPT_IN`` are tuned only when a ``--knob`` names them, and otherwise keep the job's
value: ``trainer_precision`` changes what the run computes, not only where and how fast
(bfloat16 matmuls in the trainer), and ``actor_nice`` pays on some workloads only (Humanoid-v5's
expensive steps, where the stages and the trainer wait behind 15 busy actors; not Ant-v5 or
HalfCheetah-v5, docs/BENCHMARKS.md section 10). ``env_backend`` is chosen before the run
(``auto``: EnvPool where it has the env), and the model does not predict a backend's rate.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from policies.appo_config import APPOConfig
from runtime import live
from runtime.config import TRAINER_PRECISIONS
from runtime.env_backends import envpool_ids

APPLIES = {name: "live" for name in live.RUNNER + live.SERVICE_LIVE}
APPLIES.update({name: "respawn" for name in live.ACTOR_RESPAWN})
APPLIES.update({name: "handover" for name in live.GMI_HANDOVER})
OPT_IN = ("trainer_precision", "actor_nice", "env_backend")
MPS_CHOICES = (10, 25, 50, 100)
"""The MPS shares the tuner tries (100: no limit)."""
MIN_MINIBATCH = 128
"""The fewest samples a minibatch may hold (``batch_size // minibatches``), in the sizing and in
the tuner's batch sizes alike: four trajectories at the default rollout of 32. On Ant-v5 (an
H200 host, PPO's MuJoCo settings of 32 minibatches) goodput-tuned runs that spent most of their
time at batches of 2,048 (minibatches of 64) reached 390 in 0.6M steps, then swung between
returns of 300 and 770 over the next 3M, while runs at 4,096 and up reached 1,000. Under the
learner's own floor (``--min-minibatch``) a batch splits into fewer minibatches instead, and
the count checked is the learner's (``batch_fits``)."""
MIN_TRAJECTORIES = 2
"""And the fewest whole trajectories a minibatch may hold, where the rollout length is known: a
minibatch of one trajectory is one env's correlated steps, and it runs the plain loss where
the others run the compiled one (``policies.compiled_loss``)."""


class KnobError(ValueError):
    """A knob setting that is unknown, malformed, or outside what is allowed."""


@dataclass(frozen=True)
class Knob:
    """One tunable setting.

    Attributes:
        name: The ``TrainConfig`` field.
        choices: The values the tuner may pick, in order (integers or strings).
        apply: ``live``, ``respawn``, ``handover`` or ``restart`` (see the module docstring).
        unavailable: Why the knob cannot apply on this machine, or None.
        allowed: The values a user may narrow it to, where they are more than ``choices``
            (``trainer_threads``: any count up to the cores, the tuner tries 1, 2 and 4;
            ``actor_nice``: 0..19, the tuner tries 0, 5 and 10).
    """

    name: str
    choices: tuple[Any, ...]
    apply: str
    unavailable: str | None = None
    allowed: tuple[Any, ...] = ()

    @property
    def online(self) -> bool:
        """Whether the online tuner moves it (it applies here, without a new run)."""
        return self.unavailable is None and self.apply != "restart" and len(self.choices) > 1

    def narrowed(self, spec: str) -> Knob:
        """This knob restricted by a user's ``VALUE``, ``LOW..HIGH`` or ``A,B,C``.

        Raises:
            KnobError: naming the knob, what was given and what is allowed.
        """
        pool = self.allowed or self.choices
        allowed = _listed(pool)
        if self.unavailable is not None:
            raise KnobError(f"knob {self.name} cannot be set here: {self.unavailable}")
        numeric = all(isinstance(c, int) for c in pool)
        try:
            if ".." in spec:
                lo_text, hi_text = spec.split("..", 1)
                lo, hi = int(lo_text), int(hi_text)
                if not numeric or lo > hi:
                    raise ValueError
                picked = tuple(c for c in pool if lo <= c <= hi)
            else:
                values = [int(v) if numeric else v.strip() for v in spec.split(",")]
                if any(v not in pool for v in values):
                    raise ValueError
                picked = tuple(dict.fromkeys(values))
        except ValueError:
            reversed_range = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*", spec)
            if numeric and reversed_range:  # the only way a range of integers fails
                lo, hi = reversed_range.groups()
                raise KnobError(
                    f"knob {self.name}={spec!r}: the range is reversed (LOW {lo} > HIGH {hi}); "
                    f"give {hi}..{lo}. Allowed values: {allowed}"
                ) from None
            raise KnobError(
                f"knob {self.name}={spec!r}: allowed values are {allowed} (give one "
                "value, LOW..HIGH, or a comma-separated subset)"
            ) from None
        if not picked:
            raise KnobError(f"knob {self.name}={spec!r} leaves no value; allowed: {allowed}")
        return replace(self, choices=picked, allowed=())  # narrowing again keeps within these


@dataclass(frozen=True)
class Machine:
    """What the knob space depends on: CPU cores and GPUs (SM counts) here."""

    cores: int
    gpus: int

    @classmethod
    def here(cls) -> Machine:
        """This process's cores (its affinity mask: ``taskset``, a container's CPU set) and
        the GPUs CUDA shows it."""
        from runtime.hw.gpus import torch_sees_gpu

        if not torch_sees_gpu():  # no GPU: torch is not imported for it
            return cls(usable_cores(), 0)
        import torch

        return cls(usable_cores(), torch.cuda.device_count())


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _listed(values: tuple[Any, ...]) -> str:
    """``values`` for an error message: a run of consecutive integers as ``LOW..HIGH``."""
    ints = all(isinstance(v, int) for v in values)
    if ints and len(values) > 3 and list(values) == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return ", ".join(str(v) for v in values)


def _powers(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


def batch_fits(
    batch: int, minibatches: int, rollout_len: int | None = None, min_minibatch: int = 0
) -> bool:
    """Whether ``batch`` splits into ``minibatches`` of at least ``MIN_MINIBATCH`` samples each
    (and, where ``rollout_len`` is given, into whole rollouts, ``MIN_TRAJECTORIES`` or more per
    minibatch). With the learner's floor ``min_minibatch`` (``--min-minibatch``) the count is
    the learner's own for that batch (``APPOConfig.minibatches_for``): fewer, larger minibatches
    where ``minibatches`` of them would be smaller than the floor."""
    if rollout_len is not None and batch % rollout_len:
        return False
    rows = batch // rollout_len if rollout_len else None
    learner = APPOConfig(minibatches=minibatches, min_minibatch=max(0, min_minibatch))
    m = learner.minibatches_for(batch, rows)
    return (
        batch % m == 0
        and batch // m >= MIN_MINIBATCH
        and (rows is None or rows >= MIN_TRAJECTORIES * m)
    )


BATCH_CHOICES = _powers(512, 65536)


def bounded_batches(
    minibatches: int, rollout_len: int | None = None, min_minibatch: int = 0
) -> Knob:
    """The ``batch_size`` knob of a learner of ``minibatches`` (and a job's own ``rollout_len``,
    which the online tuner does not change, and the learner's ``min_minibatch`` floor): the
    sizes that ``batch_fits`` them; where none does, every size, not tuned, saying why."""
    fitting = tuple(
        b for b in BATCH_CHOICES if batch_fits(b, minibatches, rollout_len, min_minibatch)
    )
    if fitting:
        return Knob("batch_size", fitting, APPLIES["batch_size"])
    rollouts = (
        "" if rollout_len is None else f" and {MIN_TRAJECTORIES} rollouts of {rollout_len} steps"
    )
    why = (
        f"no batch size in {BATCH_CHOICES[0]}..{BATCH_CHOICES[-1]} gives {minibatches} "
        f"minibatches of at least {MIN_MINIBATCH} samples{rollouts}"
    )
    return Knob("batch_size", BATCH_CHOICES, APPLIES["batch_size"], why)


def default_space(machine: Machine) -> dict[str, Knob]:
    """Every knob with the values worth trying on ``machine``."""
    no_gpu = None if machine.gpus else "no CUDA GPU on this machine"
    choices: dict[str, tuple[Any, ...]] = {
        "actors": tuple(range(1, machine.cores + 1)),
        "envs_per_actor": _powers(1, 64),
        "rollout_len": (16, 32, 64),
        "batch_size": BATCH_CHOICES,
        "chunk_bytes": _powers(16 * 1024, 4 * 1024 * 1024),
        "trainers": (1, 2, 4),
        "mps_pct": MPS_CHOICES,
        "trainer_device": ("cpu", "cuda") if machine.gpus else ("cpu",),
        "inference": ("actor", "gmi"),
        "trainer_threads": (1, 2, 4),
        "trainer_precision": TRAINER_PRECISIONS,
        "actor_nice": (0, 5, 10),
        "env_backend": ("gymnasium", "envpool") if envpool_ids() else ("gymnasium",),
    }
    threads = choices["trainer_threads"]
    allowed = {
        "trainer_threads": tuple(sorted({*threads, *range(1, machine.cores + 1)})),
        "actor_nice": tuple(range(20)),
    }
    knobs = [
        Knob(
            name,
            values,
            APPLIES.get(name, "restart"),
            no_gpu if name == "mps_pct" else None,
            allowed.get(name, ()),
        )
        for name, values in choices.items()
    ]
    return {k.name: k for k in knobs}


def build_space(
    machine: Machine,
    overrides: list[str] | None = None,
    minibatches: int | None = None,
    rollout_len: int | None = None,
    min_minibatch: int = 0,
) -> dict[str, Knob]:
    """The default space narrowed by ``overrides`` (``NAME=SPEC`` strings), without the
    ``OPT_IN`` knobs they do not name; with ``minibatches``, its batch sizes bounded
    (``bounded_batches``) unless an override names them: it may name any size from 512 up.

    Raises:
        KnobError: for an unknown knob, a malformed spec, or values that are not allowed.
    """
    space, named = default_space(machine), set()
    for item in overrides or []:
        name, sep, spec = item.partition("=")
        name = name.strip().replace("-", "_")
        named.add(name)
        if not sep or not spec.strip():
            raise KnobError(f"--knob {item!r}: expected NAME=VALUE, NAME=LOW..HIGH or NAME=A,B")
        if name not in space:
            raise KnobError(f"--knob {item!r}: unknown knob {name!r}; knobs: {', '.join(space)}")
        space[name] = space[name].narrowed(spec.strip())
    if minibatches is not None and "batch_size" not in named:  # explicit flags win
        space["batch_size"] = bounded_batches(minibatches, rollout_len, min_minibatch)
    return {name: k for name, k in space.items() if name not in OPT_IN or name in named}


def to_config_value(name: str, value: Any) -> Any:
    """The ``TrainConfig`` value of a knob value (``mps_pct`` is one percentage for every GMI,
    100 meaning no limit, or a list of one per GMI, as a config given to start from may hold)."""
    if name == "mps_pct":
        if isinstance(value, list | tuple):
            return tuple(int(v) for v in value)
        return None if value == 100 else (int(value),)
    return value


def knob_value(cfg: Any, name: str, cuda: bool) -> Any:
    """A config's value of knob ``name`` in knob terms, as it runs here: ``mps_pct`` None is
    100 and one share for every GMI is that share (shares that differ among the GMIs stay a
    list); ``trainer_device`` auto is cuda where ``cuda`` (a GPU here), else cpu."""
    value = getattr(cfg, name)
    if name == "mps_pct":
        if value is None:
            return 100
        return int(value[0]) if len(set(value)) == 1 else [int(v) for v in value]
    if name == "trainer_device" and value == "auto":
        return "cuda" if cuda else "cpu"
    return value


def knobs_to_wire(space: dict[str, Knob]) -> dict[str, Any]:
    """A knob space as plain data (what a daemon registration carries)."""
    return {
        k.name: {"choices": list(k.choices), "apply": k.apply, "unavailable": k.unavailable}
        for k in space.values()
    }


def knobs_from_wire(doc: dict[str, Any]) -> dict[str, Knob]:
    """Raises ``ValueError`` for a malformed knob space."""
    try:
        return {
            name: Knob(name, tuple(k["choices"]), str(k["apply"]), k.get("unavailable"))
            for name, k in doc.items()
        }
    except (AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed knob space: {exc}") from None
