"""A job that names no GPU gets one on a machine of several (``control.gpu_choice``): the daemon
spreads such jobs over the GPUs by the share each would get, keeps each on its GPU, and the job
then runs its CUDA work there and meters that GPU."""

from __future__ import annotations

import logging
import os

from autotune.control.allocator import Budget, Claim, allocate
from autotune.control.claims import claim_from, share_of
from autotune.control.gpu_choice import pick_gpu
from autotune.control.machine import MachineView
from autotune.control.sharing import MachineShares

H200 = {"name": "NVIDIA H200", "sms": 132, "memory_mib": 143771, "mig": "disabled", "mps": True}


def machine(cores: int, gpus: int, mps: tuple[bool, ...] = ()) -> MachineView:
    return MachineView.from_dict(
        {
            "cores": cores,
            "gpus": [dict(H200, index=i, mps=mps[i] if mps else True) for i in range(gpus)],
        }
    )


def test_jobs_naming_no_gpu_are_spread_by_the_share_each_would_get():
    m = machine(16, 2)
    any_gpu = Claim("c", any_gpu=True)
    assert pick_gpu(m, [], any_gpu).gpu == 0  # of equal shares, the lowest index
    assert pick_gpu(m, [Claim("a", gpu=0)], any_gpu).gpu == 1
    # a heavier job on GPU 1 leaves GPU 0 the larger share, even with two jobs there
    held = [Claim("a", gpu=0), Claim("b", gpu=0), Claim("h", gpu=1, weight=4.0)]
    assert pick_gpu(m, held, any_gpu).gpu == 0
    # a share fixed to a job counts as taken
    fixed = [Claim("f", fixed=Budget((0, 1), 0, 80), gpu=0)]
    assert pick_gpu(m, fixed, any_gpu).gpu == 1
    # a fixed budget naming no GPU goes where the most is left, its own share beside the others
    own = Claim("g", fixed=Budget((2, 3), None, 30), any_gpu=True)
    placed = pick_gpu(m, fixed, own)
    assert placed.gpu == placed.fixed.gpu == 1 and not placed.any_gpu
    # a GPU where MPS cannot run (MIG) is taken only where none can
    assert pick_gpu(machine(16, 2, (False, True)), [], any_gpu).gpu == 1
    assert pick_gpu(machine(16, 0), [], any_gpu) == any_gpu  # no GPU: no share
    assert pick_gpu(m, [], Claim("n", gpu=1)).gpu == 1  # a named GPU stands
    alloc = allocate(m, [Claim("a", gpu=0), pick_gpu(m, [Claim("a", gpu=0)], any_gpu)], {})
    assert alloc.budgets["a"].mps_pct == alloc.budgets["c"].mps_pct == 100  # a GPU each


def test_the_daemon_offers_each_job_its_own_gpu_and_keeps_it_there():
    shares = MachineShares(machine(8, 2), lambda *a: None, read_foreign=False)
    claim = claim_from("offer", {"gpu": "any"})
    assert claim.any_gpu and claim.gpu is None
    first = shares.offer(claim, pid=11)
    second = shares.offer(claim, pid=12)
    assert {first.gpu, second.gpu} == {0, 1} and first.mps_pct == second.mps_pct == 100
    for job, pid in (("job-a", 11), ("job-b", 12)):
        shares.join(share_of(claim_from(job, {"gpu": "any"}), {"pid": pid}, shares.machine))
    held = {j: s.budget.gpu for j, s in shares.shares.items()}
    assert held == {"job-a": first.gpu, "job-b": second.gpu}
    assert not any(s.claim.any_gpu for s in shares.shares.values())
    shares.leave("job-a")  # the other stays where it is: a GMI is not moved between GPUs
    assert shares.shares["job-b"].budget.gpu == second.gpu
    # a third job goes to the GPU left free
    shares.join(share_of(claim_from("job-c", {"gpu": "any"}), {"pid": 13}, shares.machine))
    assert shares.shares["job-c"].budget.gpu == first.gpu


def test_a_job_on_a_budget_of_another_gpu_runs_and_meters_its_cuda_work_there(monkeypatch, caplog):
    from autotune.workflows.tune import use_gpu
    from runtime.power_probe import cuda0_nvml_index

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert cuda0_nvml_index() == 0
    use_gpu(None)  # no GPU share: nothing set
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    use_gpu(1)
    env = os.environ
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert cuda0_nvml_index() == 1  # the probes read the power of the GPU they run on
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with caplog.at_level(logging.WARNING):
        use_gpu(1)  # the user's choice stands, and is said
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "the GMIs run where it says" in caplog.text
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1f")  # a UUID: not an index
    assert cuda0_nvml_index() == 0


def test_an_inference_gmi_is_bounded_by_the_budgets_share_as_the_trainers_are(capsys):
    from rich.console import Console

    from autotune.cli.tune_flags import inference_within
    from runtime.config import TrainConfig

    held = Budget((0, 1), 1, 25)
    cfg = TrainConfig(trainer_device="cuda", inference="gmi")
    assert inference_within(Console(), cfg, held).inference_mps_pct == 25  # unbounded before
    asked = TrainConfig(trainer_device="cuda", inference="gmi", inference_mps_pct=50)
    assert inference_within(Console(), asked, held).inference_mps_pct == 25
    assert "inference GMI at 25 % of the GPU, the budget's, not 50 %" in capsys.readouterr().out
    within = TrainConfig(trainer_device="cuda", inference="gmi", inference_mps_pct=10)
    assert inference_within(Console(), within, held) is within
    on_actors = TrainConfig(trainer_device="cuda")
    assert inference_within(Console(), on_actors, held) is on_actors
    assert inference_within(Console(), cfg, None) is cfg  # no daemon: no budget to keep to
