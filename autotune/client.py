"""The client API for a training script run under ``autotune wrap`` (``autotune.control.client``).

from autotune import client

knobs = client.knobs({"num_envs": 8, "batch_size": 256})
client.report(steps=global_step)
new = client.poll()
"""

from __future__ import annotations

from autotune.control.client import ENV_ENDPOINT, ENV_KNOBS, ENV_TRIAL, knobs, poll, report, wrapped

__all__ = ["ENV_ENDPOINT", "ENV_KNOBS", "ENV_TRIAL", "knobs", "poll", "report", "wrapped"]
