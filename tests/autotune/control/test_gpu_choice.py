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


def test_the_daemon_offers_each_job_its_own_gpu_and_keeps_it_there(live_pids):
    p11, p12, p13 = live_pids(3)
    shares = MachineShares(machine(8, 2), lambda *a: None, read_foreign=False)
    claim = claim_from("offer", {"gpu": "any"})
    assert claim.any_gpu and claim.gpu is None
    first = shares.offer(claim, pid=p11)
    second = shares.offer(claim, pid=p12)
    assert {first.gpu, second.gpu} == {0, 1} and first.mps_pct == second.mps_pct == 100
    for job, pid in (("job-a", p11), ("job-b", p12)):
        shares.join(share_of(claim_from(job, {"gpu": "any"}), {"pid": pid}, shares.machine))
    held = {j: s.budget.gpu for j, s in shares.shares.items()}
    assert held == {"job-a": first.gpu, "job-b": second.gpu}
    assert not any(s.claim.any_gpu for s in shares.shares.values())
    shares.leave("job-a")  # the other stays where it is: a GMI is not moved between GPUs
    assert shares.shares["job-b"].budget.gpu == second.gpu
    # a third job goes to the GPU left free
    shares.join(share_of(claim_from("job-c", {"gpu": "any"}), {"pid": p13}, shares.machine))
    assert shares.shares["job-c"].budget.gpu == first.gpu


def test_a_job_on_a_budget_of_another_gpu_runs_and_meters_its_cuda_work_there(monkeypatch, caplog):
    from autotune.workflows.tune import use_gpu
    from runtime.hw.gpus import nvml_index

    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):  # restored after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert nvml_index() == 0
    use_gpu(None)  # no GPU share: nothing set
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    use_gpu(1)
    env = os.environ
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert nvml_index() == 1  # the probes read the power of the GPU they run on
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with caplog.at_level(logging.WARNING):
        use_gpu(1)  # the user's choice stands, and is said
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "the GMIs run where it says" in caplog.text
    # the result names the GMI's GPU both ways (job b on a 2-GPU H200 host said only "gpu": 0)
    from runtime.results import gmi_doc

    doc = gmi_doc("trainer-0.g0", {"device": "cuda", "gpu": 0, "mps_pct": 100})
    assert doc["gpu"] == 0 and doc["nvml_gpu"] == 0  # CUDA_VISIBLE_DEVICES=0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gmi_doc("trainer-0.g0", {"device": "cuda", "gpu": 0})["nvml_gpu"] == 1
    assert gmi_doc("trainer-0.g0", {"device": "cpu", "gpu": None})["nvml_gpu"] is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1f")  # a UUID: not an index
    assert nvml_index() == 0
    assert gmi_doc("trainer-0.g0", {"device": "cuda", "gpu": 0})["nvml_gpu"] is None  # unknown
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert gmi_doc("trainer-1.g0", {"device": "cuda", "gpu": 1})["nvml_gpu"] is None  # no entry


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


def test_a_gpu_where_the_job_would_not_be_admitted_is_not_picked():
    m = machine(16, 2)
    crowded = [Claim(f"j{i}", gpu=0, weight=0.1) for i in range(10)]  # 10 % each: GPU 0 full
    assert pick_gpu(m, crowded, Claim("c", any_gpu=True, weight=5.0)).gpu == 1
    fixed = [Claim("f", fixed=Budget((0,), 1, 90), gpu=1)]  # 10 % left on GPU 1
    assert pick_gpu(m, fixed, Claim("c", fixed=Budget((2,), None, 30), any_gpu=True)).gpu == 0


def test_registration_admits_and_places_a_job_on_the_gpu_of_the_budget_it_holds():
    """After a daemon restart or a lapsed offer, a job registers holding a budget on a GPU:
    admission checks that GPU and the job stays there; one holding nothing is placed afresh."""
    shares = MachineShares(machine(8, 2), lambda *a: None, read_foreign=False)
    shares.join(share_of(claim_from("a", {"gpu": 0}), {"pid": None}, shares.machine))
    held = {"held": {"cores": [4, 5], "gpu": 0, "mps_pct": 50}}
    back = share_of(claim_from("b", {"gpu": "any"}), held, shares.machine)
    assert back.budget.gpu == 0
    assert shares.admit(back.claim, None, back.budget) is None
    shares.join(back)
    assert shares.shares["b"].claim.gpu == 0 and shares.shares["b"].budget.gpu == 0
    fresh = share_of(claim_from("c", {"gpu": "any"}), {"pid": 99}, shares.machine)
    shares.join(fresh)  # no offer, no budget held: GPU 1 has the room
    assert shares.shares["c"].budget.gpu == 1


def test_a_job_claims_any_gpu_only_when_asking_before_it_has_one(monkeypatch):
    import autotune.workflows.tune as tune
    from runtime.config import TrainConfig

    monkeypatch.setattr(tune, "no_gpu_reason", lambda: None)  # as on a GPU machine
    for name in ("CUDA_VISIBLE_DEVICES",):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    opts, cfg = tune.TuneOptions(), TrainConfig()
    assert opts.claim(cfg, offer=True)["gpu"] == "any"
    assert opts.claim(cfg)["gpu"] == 0  # registering with no offer taken: where it runs
    assert opts.claim(TrainConfig(gpus=(1,)), offer=True)["gpu"] == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")  # chosen already: its NVML index
    assert opts.claim(cfg, offer=True)["gpu"] == 3
    assert opts.claim(TrainConfig(gpus=(1,)))["gpu"] == 2
    monkeypatch.setattr(tune, "no_gpu_reason", lambda: "no GPU")
    assert opts.claim(cfg, offer=True)["gpu"] is None


def test_an_offer_charges_the_gpu_it_names_and_mps_sees_every_gpu(monkeypatch):
    from autotune.control import job_link
    from runtime.hw.mps import MPSControl

    answer = {"type": "offer", "budget": Budget((0, 1), 1, 50).to_dict()}
    answer |= {"gpu_share": 0.5, "cpu_share": 0.25, "gpu_index": 1}
    monkeypatch.setattr(job_link.protocol, "request", lambda *a, **k: answer)
    budget, shares = job_link.ask_offer("ipc:///nowhere", {"gpu": "any"})
    assert budget.gpu == 1 and shares == {"gpu_share": 0.5, "cpu_share": 0.25, "gpu_index": 1}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a job on a budget of GPU 1
    env = MPSControl(pipe_dir="/tmp/x", binary=None)._env()
    assert "CUDA_VISIBLE_DEVICES" not in env and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_gpu_another_process_computes_on_is_picked_last():
    """A process the daemon does not manage (NVML sees its context) holds part of its GPU: a
    job naming no GPU goes to a free one, and to the foreign one only where all are taken."""
    m = machine(16, 2)
    any_gpu = Claim("c", any_gpu=True)
    assert pick_gpu(m, [], any_gpu, foreign=frozenset({0})).gpu == 1
    assert pick_gpu(m, [], any_gpu, foreign=frozenset({0, 1})).gpu == 0  # of equals, the lowest
    # through the daemon's share-out, as its foreign load reads it
    shares = MachineShares(m, lambda *a: None, read_foreign=False)
    shares.foreign = {**shares.foreign, "gpus": [0]}
    assert shares.offer(claim_from("offer", {"gpu": "any"}), pid=os.getpid()).gpu == 1
