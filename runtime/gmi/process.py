"""The entry points of trainer GMI processes: ``trainer_main`` (a GMI started for its role) and
``spare_main`` (a process started ahead, that becomes a GMI when a role is handed to it:
``runtime.gmi.spares``)."""

from __future__ import annotations

import importlib
import logging
import os
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
    cpu_build_modules: tuple[str, ...] = (),
) -> None:
    """Process entry point of a spare GMI: imports ``modules`` (torch and the learner's), and
    ``cpu_build_modules`` too where torch has no CUDA (no driver to start), says ``READY`` on
    ``ready_out``, then waits for its role on ``role_in`` (both pipes from the runner) and runs
    ``trainer_main`` with it. A pipe closed with no role (the run ended, or it let the spare
    go) ends the process.

    The imports must not start the CUDA driver: it reads the MPS percentage and the visible
    devices once, as it starts, and the role is not known yet. A spare whose imports loaded the
    driver exits (code 3) without saying it is ready, so it is never given a role, and the
    runner starts GMIs afresh: on an H200 host, a spare that had imported TorchDynamo and
    TorchInductor too became a GMI given 50 % that ran on all 132 SMs.
    """
    init_service_process("spare-gmi", kernel_cache=True)
    import torch

    if not torch.backends.cuda.is_built():
        modules = modules + cpu_build_modules
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # the GMI imports what it needs as it starts
            logger.debug("a spare GMI could not import %s ahead: %s", name, exc)
    if cuda_driver_loaded():
        logger.warning(
            "a spare GMI's imports (%s) loaded the CUDA driver before its MPS share was known; "
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


def cuda_driver_loaded() -> bool:
    """Whether this process has loaded the CUDA driver (``libcuda``), which it does as the CUDA
    runtime first starts; False where that cannot be read (no ``/proc``: no MPS either)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return False
