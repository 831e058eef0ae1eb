"""``runtime.initial_weights``: the version-0 weights are kept in the cache folder, so a later
run of the same policy and seed reads them and its runner never imports torch; what is kept
is the trainer's own version-0, and a torn file is built again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

ASK = """
import json, sys
from runtime.config import TrainConfig
from runtime.initial_weights import InitialWeights
cfg = TrainConfig(env="CartPole-v1", trainer_device="cpu", seed=int(sys.argv[1]))
names, arrays = InitialWeights(cfg.validate()).arrays(cfg)
print(json.dumps({"torch": "torch" in sys.modules, "sum": float(sum(a.sum() for a in arrays)),
                  "names": names}))
"""


def _ask(tmp_path, seed: int) -> dict:
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", ASK, str(seed)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_version_0_weights_are_kept_and_read_back_without_torch(tmp_path):
    from policies.actor_critic import initial_state_arrays

    first = _ask(tmp_path, 3)
    assert first["torch"]  # built once, with torch
    (kept,) = (tmp_path / "initial-weights").glob("*.npz")
    again = _ask(tmp_path, 3)
    assert again == {**first, "torch": False}  # read back: the runner imports no torch
    names, arrays = initial_state_arrays(4, 2, True, "auto:64:64:auto", True, seed=3)
    assert names == first["names"]  # the trainer's own version-0 (its default policy)
    assert np.isclose(float(sum(a.sum() for a in arrays)), first["sum"])
    assert _ask(tmp_path, 4)["sum"] != first["sum"]  # another seed: its own, kept beside
    assert len(list((tmp_path / "initial-weights").glob("*.npz"))) == 2
    kept.write_bytes(b"torn")  # a torn file is not read: built again and kept anew
    assert _ask(tmp_path, 3) == first
    assert _ask(tmp_path, 3) == {**first, "torch": False}
