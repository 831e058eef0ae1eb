"""The runner's trainer GMIs: their placement, how they share GPUs, and their generations.

A generation is one set of GMI processes. ``GMIFleet.replace`` starts the next generation
(an MPS client's percentage is fixed for its life, so a percentage change needs new
processes): the new GMIs ask for chunks, and train, once they have loaded the learner state
that the old ones write when they retire (``runtime.trainer``).

Make before break: the old generation keeps training while the new one starts (a Python
process importing torch, and on a GPU a CUDA context as an MPS client: seconds). Only once
every new GMI has reported (its learner is built) is the migrator told to ``retire`` the old
one, so training pauses for the state's hand-over alone, not for the new processes' start-up.
A new generation that has not reported within ``STANDBY_MAX_S`` is not waited for any longer.
Where GMIs are likely to be replaced (MPS may be set later: a tuner or live changes; or the
run has replaced them once), spare processes that have imported torch wait to become the next
generation's GMIs (``runtime.gmi.spares``), so that its start takes less.
The ``retire`` COMMAND is resent until the migrator reports it, since PUB/SUB drops a message
sent before a subscriber has joined.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from runtime import checkpoint, commands, topology
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.gmi import placement
from runtime.gmi.placement import GMISpec
from runtime.gmi.process import trainer_main
from runtime.gmi.role import GMIRole, recovery_file, state_file
from runtime.gmi.spares import Spares
from runtime.hw.mps import MPSControl, MPSUnavailable
from runtime.inference import InferencePlace
from runtime.learner_state import Saved, furthest

logger = logging.getLogger(__name__)

RETIRE_RESEND_S = 0.5
STANDBY_MAX_S = 120.0
"""The longest an old generation keeps training while the next one starts; then it retires
whether or not the new GMIs have reported (the supervisor deals with one that never does)."""

Spawn = Callable[[str, Callable[..., None], tuple[Any, ...]], None]


class GMIFleet:
    """The current generation of trainer GMIs and the MPS daemon they use.

    Args:
        cfg: The run's configuration (validated).
        info: The environment description.
        spawn: Starts a named service process (the runner's, so it watches them all).
        spares: Spare GMI processes to start GMIs from where they are wanted (None: none).
    """

    def __init__(
        self, cfg: TrainConfig, info: EnvInfo, spawn: Spawn, spares: Spares | None = None
    ) -> None:
        self.cfg, self.info, self.spawn, self.spares = cfg, info, spawn, spares
        self._replaced_later = False  # whether GMIs may be replaced: spares are then kept
        self.gmis: list[GMISpec] = placement.place(cfg)
        self.generation = 0
        self.reset_epoch = 0
        """The run's newest pipeline reset (``runtime.supervisor``), handed to every GMI started."""
        self.floor_version = 0
        """The version a resumed run went on from (``GMIRole.floor_version``), else 0."""
        self.mps_note: str | None = None
        """Why MPS could not start, when ``sharing`` is ``shared``."""
        self.mps: Any = None
        self._retiring: dict[int, int] = {}
        """Generations being retired (-> GMIs of the next) until the migrator confirms."""
        self._standby: dict[int, tuple[list[str], float]] = {}
        """Generations still training while the next starts (-> the next's GMI names, and
        ``time.monotonic()`` when they were started)."""
        self.handovers: list[dict[str, Any]] = []
        """One entry per hand-over: the new ``generation``, ``standby_s`` (how long the old
        generation trained on while the new one started) and ``waited_out`` (True when the new
        GMIs had not reported within ``STANDBY_MAX_S``)."""
        self._retire_sent = 0.0
        self._set_up = False
        self.started_from: str | None = None
        """The learner state file the current generation started from (None: a fresh one)."""

    @property
    def sharing(self) -> str:
        """How the current GMIs share their GPUs: ``mps``, ``shared`` (MPS was wanted but could
        not start), ``exclusive`` or ``cpu`` (see ``runtime.gmi.placement``)."""
        if all(s.gpu is None for s in self.gmis):
            return "cpu"
        if self.mps is not None:
            return "mps"
        return "shared" if self.mps_note is not None else "exclusive"

    def check(self, mps_pct: tuple[int, ...] | None, cfg: TrainConfig | None = None) -> None:
        """Raises ValueError now if ``mps_pct`` does not fit the GMIs of ``cfg`` (default: the
        current config), or if those GMIs need MPS and this run has no MPS daemon."""
        cfg = cfg or self.cfg
        gmis = placement.place(cfg, mps_pct)
        no_mps = self.mps is None and self.mps_note is None  # neither running nor tried
        if self._set_up and no_mps and placement.wants_mps(gmis):
            raise ValueError(
                f"GMIs {[(g.gpu, g.mps_pct) for g in gmis]} need MPS, which this run did not "
                "start; start the run with MPS (a planned --mps-change, or mps_live=True)"
            )

    def setup_sharing(self, mps_later: bool) -> None:
        """Decides how GMIs share their GPUs; starts or reuses MPS where it is wanted.

        Args:
            mps_later: A percentage may be set during the run (MPS must run from the start),
                also where the GMIs start on the CPU and a tuner may move them to a GPU.
        """
        self._set_up = True
        self._replaced_later = mps_later
        if self.sharing == "cpu" and not mps_later:
            return  # CPU GMIs, and none will move to a GPU share during the run
        if not (
            placement.wants_mps(self.gmis) or mps_later or self.cfg.inference_mps_pct is not None
        ):
            return
        try:
            mps = MPSControl()
            mps.start()
            self.mps = mps
        except MPSUnavailable as exc:
            self.mps_note = str(exc)
            logger.warning(
                "MPS unavailable (%s): trainer GMIs run as plain shared processes "
                "and no SM percentage applies",
                exc,
            )

    def start(self, ep: topology.Endpoints, run_dir: str, resume_from: str | None = None) -> None:
        """Starts the current generation's GMI processes, which go on from the learner state in
        ``resume_from`` (None: a fresh learner)."""
        self.started_from = resume_from
        layout = placement.layout(self.gmis)
        for spec in self.gmis:
            env = self.mps.client_env(spec.mps_pct) if self.mps and spec.gpu is not None else {}
            role = GMIRole(
                spec,
                self.generation,
                layout,
                run_dir,
                resume_from,
                env,
                self.reset_epoch,
                self.floor_version,
            )
            args = (self.cfg, self.info, ep, role)
            if self.spares is None or not self.spares.take(role.name, args):
                self.spawn(role.name, trainer_main, args)

    def restart(self, ep: topology.Endpoints, run_dir: str, fallback: str | None) -> Saved | None:
        """Starts a new generation in place of one that died (its processes already gone), from
        the learner state the run kept that has come furthest, and returns it (None: a fresh
        learner, where none was kept).

        The states kept (``kept``): the lead GMI's recovery file (every ``RECOVERY_S``), the
        hand-over files of the generation before and of this one, where it retired, the file
        the generation that died started from, the run's ``--checkpoint`` ``learner.pt``
        (every ``checkpoint_every_s``), and ``fallback`` (the state the run started from).
        Furthest is by ``state_key`` (version, then trained steps): both only grow as the
        learner updates, and every state kept is of one line of descent (each restart goes on
        from the furthest, so no state ahead of it is left behind), so the greater key is the
        later state. A file's time is no measure: it says when the file was written, not how
        far the learner in it had come. Where two are as far, they hold one state, and the one
        written last is taken."""
        newest = self.kept(run_dir, fallback)
        self.generation += 1
        self._standby.clear()  # every trainer process was killed, the standby ones too
        logger.warning(
            "trainer GMIs restarted as generation %d from %s",
            self.generation,
            f"{newest.path} (version {newest.version}, {newest.trained_steps} trained steps)"
            if newest is not None
            else "a fresh learner (no state kept)",
        )
        self.start(ep, run_dir, newest.path if newest is not None else None)
        return newest

    def kept(self, run_dir: str, fallback: str | None) -> Saved | None:
        """Of the learner states the run kept (``restart`` names them), the furthest."""
        ckpt = self.cfg.checkpoint
        return furthest(
            [
                recovery_file(run_dir),
                state_file(run_dir, self.generation - 1),
                state_file(run_dir, self.generation),
                self.started_from,
                os.path.join(ckpt, checkpoint.STATE_NAME) if ckpt is not None else None,
                fallback,
            ]
        )

    def inference_place(self) -> InferencePlace:
        """Where the inference GMI runs (``inference='gmi'``): on the first trainer GPU, an MPS
        client when MPS runs (with ``inference_mps_pct``), else on the CPU."""
        cfg = self.cfg
        if all(s.gpu is None for s in self.gmis):
            return InferencePlace(None, None, {}, cfg.trainer_threads)
        pct = cfg.inference_mps_pct if self.mps is not None else None
        env = self.mps.client_env(pct) if self.mps is not None else {}
        return InferencePlace(cfg.gpu_list()[0], pct, env, 1)

    def names(self) -> list[str]:
        """Telemetry names of the current generation's GMIs."""
        return [topology.trainer_name(s.rank, self.generation) for s in self.gmis]

    @property
    def retire_pending(self) -> bool:
        """Whether a generation is still to be retired, or its retirement is not yet confirmed
        by the migrator. A drain holds the end of stream back until it is not: a migrator that
        ended first would send the old GMIs EOS instead of RETIRE, and the new ones would wait
        for a learner state that never comes."""
        return bool(self._standby or self._retiring)

    def replace(
        self,
        ep: topology.Endpoints,
        run_dir: str,
        command_sock: commands.CommandOut,
        mps_pct: tuple[int, ...] | None,
        cfg: TrainConfig | None = None,
    ) -> None:
        """Starts the next generation; the current one retires once the new GMIs have
        reported (``send_retire``).

        Args:
            mps_pct: New percentages (None: the same, or ``cfg``'s).
            cfg: A new configuration for the GMIs (count, device, GPUs, threads, sync).
        """
        old = self.generation
        self._replaced_later = True  # a run that replaced its GMIs once may do so again
        if cfg is not None:  # check() has refused GMIs that need an MPS daemon it lacks
            self.cfg = cfg
            self.gmis = placement.place(cfg)
        if mps_pct is not None:
            self.gmis = placement.place(self.cfg, mps_pct)
        self.generation = old + 1
        logger.info(
            "GMI hand-over: generation %d -> %d, MPS %s",
            old,
            self.generation,
            [s.mps_pct for s in self.gmis],
        )
        since = time.monotonic()  # before the spawn: a process's start blocks for a while
        self.start(ep, run_dir, state_file(run_dir, old))
        self._standby[old] = (self.names(), since)

    def send_retire(
        self,
        command_sock: commands.CommandOut,
        migrator: dict[str, Any] | None,
        reported: Callable[[str], bool] | None = None,
        force: bool = False,
    ) -> None:
        """Retires every generation whose successor has started, and (re)sends ``retire`` for
        every generation the migrator has not yet reported retired.

        Args:
            command_sock: The runner's COMMAND PUB.
            migrator: The migrator's newest telemetry (its ``retired_generations``), or None.
            reported: Whether a GMI has reported (its learner is built). None: retire every
                generation on standby now (the run is draining).
            force: Send now rather than at most every ``RETIRE_RESEND_S``.

        Once the current generation has reported, the spares are topped up for the next one;
        during the drain (``reported`` None) they are let go.
        """
        now = time.monotonic()
        if reported is None:
            self.let_spares_go()
        elif all(reported(name) for name in self.names()):
            self._tend_spares()
        for gen, (names, since) in list(self._standby.items()):
            started = reported is not None and all(reported(name) for name in names)
            waited_out = reported is not None and now - since >= STANDBY_MAX_S
            if started or waited_out or reported is None:
                del self._standby[gen]
                self._retiring[gen] = len(names)
                force = True
                self.handovers.append(
                    {"generation": gen + 1, "standby_s": now - since, "waited_out": waited_out}
                )
                if waited_out:
                    logger.warning(
                        "GMI generation %d has not reported in %.0f s; generation %d retires",
                        gen + 1,
                        STANDBY_MAX_S,
                        gen,
                    )
        done = (migrator or {}).get("retired_generations")
        for gen in [g for g in self._retiring if isinstance(done, list) and g in done]:
            del self._retiring[gen]
        if not self._retiring or (not force and now - self._retire_sent < RETIRE_RESEND_S):
            return
        for gen, next_gmis in self._retiring.items():
            meta = {"cmd": "retire", "generation": gen, "next_trainers": next_gmis}
            command_sock.send(meta)
        self._retire_sent = now

    def _tend_spares(self) -> None:
        if self.spares is not None and self._replaced_later and self.spares.allowed:
            self.spares.wanted = len(self.gmis)
            self.spares.top_up()
        elif self.spares is not None and self.spares.idle:  # one started ahead, not taken
            self.spares.stop()

    def let_spares_go(self) -> None:
        """Kills the idle spare GMIs (none is needed any more: the run drains or ends)."""
        if self.spares is not None:
            self.spares.stop()

    def stop(self) -> None:
        """Lets the spare GMIs go; stops the MPS daemon if this run started it."""
        self.let_spares_go()
        if self.mps is not None:
            self.mps.stop()
