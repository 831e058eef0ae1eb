"""The probe cache's key names the host, not the affinity mask: a job given some of the cores
finds the workload's probes measured for the whole machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime import probe_cache


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux affinity")
def test_a_narrowed_affinity_mask_keeps_the_hosts_cache_key():
    code = (
        "import json, os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from runtime import probe_cache; "
        "print(json.dumps([probe_cache.machine_facts(), probe_cache.mask_cores()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    facts, mask = json.loads(out.stdout)
    assert mask == 1  # the loaded probe would run one actor, on the one core it may use
    assert facts == probe_cache.machine_facts()
    spec = {"env": "CartPole-v1", "policy": "64", "format": probe_cache.FORMAT}
    assert probe_cache.cache_key(spec, facts) == probe_cache.cache_key(
        spec, probe_cache.machine_facts()
    )
