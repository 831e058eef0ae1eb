"""The entry points of trainer GMI processes: ``trainer_main`` (a GMI started for its role) and
``spare_main`` (a process started ahead, that becomes a GMI when a role is handed to it:
``runtime.gmi.spares``)."""

from __future__ import annotations

import importlib
import logging
import os
import re
from multiprocessing.connection import Connection

import zmq

from runtime import topology
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.gmi import placement
from runtime.gmi.role import GMIRole
from runtime.stages.common import StatsSender, init_service_process
from runtime.startup_clock import StartupClock
from runtime.trainer import Trainer

# torch (and the policies and GMI group that import it) loads inside functions: the runner imports
# this module without it, and a GMI only after ``placement.bind_gpu`` set its CUDA and MPS env.

logger = logging.getLogger(__name__)

READY = b"ready"
"""What a spare sends once its imports are done and it waits for its role."""


def trainer_main(
    cfg: TrainConfig,
    info: EnvInfo,
    endpoints: topology.Endpoints,
    role: GMIRole,
    asked_at: float | None = None,
) -> None:
    """Process entry point of one trainer GMI. ``asked_at``: when the runner handed the role to
    a spare process (``time.monotonic()``, one clock for every process of the host), whose start
    then counts from there (None: from this process's creation)."""
    clock = StartupClock(asked_at)
    placement.bind_gpu(role.spec.gpu, role.env)
    init_service_process(role.name, kernel_cache=True)
    import torch

    clock.took("torch_import")

    torch.set_num_threads(cfg.trainer_threads)
    group = None
    if role.world > 1:
        from runtime.gmi.group import TrainerGroup

        if role.spec.gpu is not None:
            torch.cuda.set_device(0)
        group = TrainerGroup(
            role.spec.rank, role.layout, role.group_file(), role.spec.gpu is not None, cfg.grad_sync
        )
    ctx = zmq.Context()
    dealer = topology.trainer_experience_in(ctx, endpoints, role.name)
    weights = topology.trainer_weights_out(ctx, endpoints) if role.spec.rank == 0 else None
    stats = StatsSender(topology.telemetry_out(ctx, endpoints), role.name, endpoints.run_key)
    commands = topology.command_in(ctx, endpoints)
    clock.took("group_and_sockets")
    trainer = Trainer(cfg, info, dealer, weights, stats, role, group, commands, endpoints.run_key)
    trainer.startup = clock.doc(trainer.built_s)
    logger.info(
        "%s on %s (gpu %s, mps %s%%, %s SMs, pid %d)",
        role.name,
        trainer.device,
        role.spec.gpu,
        role.spec.mps_pct,
        trainer.sm_count,
        os.getpid(),
    )
    trainer.run()
    if group is not None:
        group.close()
    ctx.destroy(linger=topology.LINGER_MS)


def spare_main(
    role_in: Connection,
    ready_out: Connection,
    modules: tuple[str, ...],
) -> None:
    """Process entry point of a spare GMI: imports ``modules`` (torch, the learner's modules
    and TorchDynamo: ``runtime.gmi.spares.MODULES``), says ``READY`` on
    ``ready_out``, then waits for its role on ``role_in`` (both pipes from the runner) and runs
    ``trainer_main`` with it. A pipe closed with no role (the run ended, or it let the spare
    go) ends the process.

    The imports must not start the CUDA driver: it reads the MPS percentage and the visible
    devices once, as it starts (``cuInit``), and the role is not known yet. Loading the
    driver's library is harmless (torch builds with CUDA map ``libcuda`` as torch is
    imported); starting it is not. A spare whose imports started the driver exits (code 3)
    without saying it is ready, so it is never given a role, and the runner starts GMIs
    afresh: on an H200 host, a spare that had imported TorchInductor's ``compile_fx`` too
    became a GMI given 50 % that ran on all 132 SMs.
    """
    init_service_process("spare-gmi", kernel_cache=True)
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # the GMI imports what it needs as it starts
            logger.debug("a spare GMI could not import %s ahead: %s", name, exc)
    if cuda_driver_started():
        logger.warning(
            "a spare GMI's imports (%s) started the CUDA driver before its MPS share was known; "
            "GMIs start afresh instead",
            ", ".join(modules),
        )
        raise SystemExit(3)
    try:
        ready_out.send_bytes(READY)
        cfg, info, endpoints, role, asked_at = role_in.recv()
    except (EOFError, OSError):
        return
    finally:
        role_in.close()
        ready_out.close()
    trainer_main(cfg, info, endpoints, role, asked_at)


_DRIVER_NODE = re.compile(r"nvidia(ctl|-uvm|\d+)")


def cuda_driver_started() -> bool:
    """Whether this process has started the CUDA driver: ``cuInit`` opens the driver's device
    nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidiaN``), and reads the MPS share
    and the visible devices then. Mapping ``libcuda`` alone, as a torch built with CUDA does on
    import, opens none. False where ``/proc`` cannot be read (no MPS either)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since it was listed
            continue
        if _DRIVER_NODE.fullmatch(os.path.basename(target)):
            return True
    return False
