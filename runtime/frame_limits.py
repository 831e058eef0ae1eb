"""How large a frame the run's links carry, and the settings that would need larger ones.

The compressor holds at most ``ROLLOUT_MAX_BYTES`` of incomplete rollouts, so one rollout's
channel (its observations: envs per actor x (rollout length + 1) x observation size, as
float32) must fit in it; a chunk's channel is at most ``chunk_bytes`` plus one rollout's. The
bound inputs of the data links take frames up to ``DATA_MAX_BYTES`` and those of credits and
telemetry up to ``SMALL_MAX_BYTES`` (``runtime.topology``): a larger frame, which none of the
run's processes makes, disconnects its sender before it is read into memory. A config that
would make a larger rollout, or a larger ``chunk_bytes``, is refused before it runs
(``TrainConfig.validate``), rather than its experience being dropped unread.
"""

from __future__ import annotations

ROLLOUT_MAX_BYTES = 256 * 2**20
CHUNK_MAX_BYTES = 256 * 2**20
DATA_MAX_BYTES = ROLLOUT_MAX_BYTES + CHUNK_MAX_BYTES + 2**20  # and the headers
SMALL_MAX_BYTES = 16 * 2**20


def rollout_problem(envs: int, rollout_len: int, width: int) -> str | None:
    """Why a rollout of ``envs`` x ``rollout_len`` steps, ``width`` floats per step in its
    widest channel (the observation, or the action), is too large for the links, or None."""
    size = envs * (rollout_len + 1) * width * 4
    if size <= ROLLOUT_MAX_BYTES:
        return None
    return (
        f"envs_per_actor={envs} x (rollout_len={rollout_len} + 1) x {width} floats is "
        f"{size / 2**20:.0f} MiB in one rollout channel; the pipeline holds rollouts of at "
        f"most {ROLLOUT_MAX_BYTES // 2**20} MiB: give fewer envs per actor or a shorter rollout"
    )
