"""What one trainer GMI process is (``GMIRole``: its place, generation and group), where a
generation leaves the learner state when it retires (``state_file``), and where the lead GMI
keeps it for a replacement should the generation die (``recovery_file``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from runtime import topology
from runtime.gmi.placement import GMISpec


@dataclass(frozen=True)
class GMIRole:
    """What one trainer GMI process is: its place, its generation and its group.

    Attributes:
        spec: Rank, GPU and MPS percentage.
        generation: 0 for the first GMIs of a run, +1 at every hand-over.
        layout: Per GPU, the ranks of this generation (see ``runtime.gmi.placement``).
        run_dir: The run's private directory (rendezvous and hand-over files).
        resume_from: The previous generation's state file to wait for (generation 0: the
            checkpoint the run resumes from; a generation started in place of one that died:
            the state kept that had come furthest, ``GMIFleet.restart``), or None.
        env: Environment for the process (MPS client variables), set before CUDA starts.
        reset_epoch: The run's newest pipeline reset when the GMI starts (``runtime.supervisor``):
            a GMI started after a replacement holds nothing of the old pipeline, so it takes
            only newer resets.
        floor_version: Experience sampled with an older policy version is discarded: in a run
            resumed from a checkpoint, the version it resumed at (the actors' first weights,
            and a restarted actor's, are fresh, not the loaded ones), in every generation; 0
            otherwise.
    """

    spec: GMISpec
    generation: int
    layout: list[list[int]]
    run_dir: str
    resume_from: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    reset_epoch: int = 0
    floor_version: int = 0

    @property
    def name(self) -> str:
        return topology.trainer_name(self.spec.rank, self.generation)

    @property
    def world(self) -> int:
        return sum(len(ranks) for ranks in self.layout)

    def state_file(self) -> str:
        """Where rank 0 of this generation leaves the learner state when it retires."""
        return state_file(self.run_dir, self.generation)

    def recovery_file(self) -> str:
        return recovery_file(self.run_dir)

    def group_file(self) -> str:
        return os.path.join(self.run_dir, f"group-g{self.generation}")


def state_file(run_dir: str, generation: int) -> str:
    """The learner-state file that generation ``generation`` leaves when it retires."""
    return os.path.join(run_dir, f"handover-g{generation}.pt")


def recovery_file(run_dir: str) -> str:
    """Where the lead GMI of the current generation keeps the learner state every
    ``runtime.trainer.RECOVERY_S``, for a generation started in place of one that died."""
    return os.path.join(run_dir, "recovery.pt")
