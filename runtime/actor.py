"""Actor processes: K environments (gymnasium or EnvPool, ``runtime.env_backends``), and the
policy on their own core or on a GMI.

Each actor collects rollouts of ``rollout_len`` steps from its K environments and hands them to
its dispenser. With ``inference='actor'`` it runs the policy itself and checks (without
blocking) for newer weights between steps; env stepping never waits for a weight update. With
``inference='gmi'`` it sends observations to the inference GMI (``runtime.policy_io``) in two
groups of environments, stepping one group while the other waits for its actions.

Between rollouts it waits only for back-pressure: while more than
``TrainConfig.inflight_steps_per_actor()`` of its steps have not yet been handed to a trainer
(the migrator publishes the counts as receipts), it collects nothing more, which bounds the
queues and so the policy lag. It stops only at a rollout boundary,
and exits only once the receipts cover everything it sent, so a clean shutdown loses
nothing.

Truncated episodes (time limits) are bootstrapped on the spot: ``gamma * V(final_obs)`` is added
to the last reward and the step is marked done, so the learner needs no extra channel for it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from runtime import wire
from runtime.commands import CommandIn
from runtime.config import TrainConfig
from runtime.env_backends import actor_threads, make_envs
from runtime.envs import EnvInfo
from runtime.policy_io import LocalPolicy, RemotePolicy
from runtime.receipts import Receipts
from runtime.reward_norm import RewardNormalizer
from runtime.stages.common import LiveSettings, StatsSender
from runtime.stages.dispenser import Dispenser

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
THROTTLE_POLL_MS = 20
DELIVERY_TIMEOUT_S = 30.0
"""How long a stopping actor whose runner is gone (its parent process changed) waits for the
trainer to confirm its last rollouts. While its runner lives the actor waits on, up to
``DELIVERY_CEILING_S``: the runner's drain decides how long that is (it waits while the run
trains what is in flight, ``runtime.drain.Patience``, and kills an actor it gives up on)."""
DELIVERY_CEILING_S = 3600.0
NONFINITE_EXIT = 3
"""An actor's exit code after its env returned a non-finite value (it is not restarted)."""


class NonFiniteEnv(ArithmeticError):
    """An env returned a non-finite observation or reward."""


def env_seed(seed: int, actor: int, incarnation: int, k: int) -> int:
    """The first of an actor's ``k`` env seeds (env ``i``: + ``i``), drawn from the run's seed, the
    actor and its restart; below 2**31 - ``k`` for any seed (EnvPool's are int32, >= 0)."""
    entropy = np.random.SeedSequence([seed, actor, incarnation]).generate_state(1)[0]
    return int(entropy) % (2**31 - k)


class Actor:
    """The rollout loop of one actor process."""

    def __init__(
        self,
        cfg: TrainConfig,
        info: EnvInfo,
        actor: int,
        incarnation: int,
        dispenser: Dispenser,
        policy: LocalPolicy | RemotePolicy,
        receipts: Receipts,
        stats: StatsSender | None,
        stepped: Any,
        commands: CommandIn | None = None,
        threads: int | None = None,
    ) -> None:
        self.cfg, self.info = cfg, info
        self.index = actor
        self.commands = commands
        self.live = LiveSettings()
        self.budget = cfg.inflight_steps_per_actor()
        """Steps sent but not yet handed to a trainer before this actor waits (live)."""
        self.malformed = wire.MalformedCounter("actor-commands")
        self.dispenser, self.policy, self.stats = dispenser, policy, stats
        self.receipts = receipts
        self.stepped = stepped
        k = cfg.envs_per_actor
        base_seed = env_seed(cfg.seed, actor, incarnation, k)
        threads = threads or actor_threads(cfg.actors)
        self.envs = make_envs(cfg.env, cfg.env_backend, k, base_seed, threads)
        self.obs = self.envs.reset()
        split = isinstance(policy, RemotePolicy) and k >= 2
        self.groups = [slice(0, k // 2), slice(k // 2, k)] if split else [slice(0, k)]
        """Environments stepped together; two groups take turns waiting for a remote policy."""
        self.ep_return = np.zeros(k)
        self.ep_length = np.zeros(k, np.int64)
        self.episodes: list[list[float]] = []
        self.waits = 0
        self.sent_steps = 0
        self.reward_norm = (
            RewardNormalizer(k, cfg.learner.gamma) if cfg.learner.normalize_reward else None
        )
        self.throttle_s = 0.0
        """Seconds spent waiting for receipts (the in-flight budget full: the learner behind)."""
        self.dispatch_s = 0.0
        """Seconds spent handing rollouts to the stages (blocked while they push back)."""
        self.env_s = self.policy_s = 0.0
        """Seconds stepping the envs (with the episode bookkeeping) and getting actions."""
        self.cpu_0 = time.process_time()  # the process's CPU (every thread) from here on
        if not info.discrete:
            self.act_low = np.asarray(info.act_low, np.float32)
            self.act_high = np.asarray(info.act_high, np.float32)

    def collect(self) -> dict[str, np.ndarray]:
        """Steps every environment ``rollout_len`` times; returns the rollout's channels."""
        k, t_len, info = self.cfg.envs_per_actor, self.cfg.rollout_len, self.info
        gamma, scale = self.cfg.learner.gamma, self.cfg.learner.reward_scale
        buf = {
            "obs": np.empty((k, t_len + 1, info.obs_dim), np.float32),
            "actions": (
                np.empty((k, t_len), np.int64)
                if info.discrete
                else np.empty((k, t_len, info.act_dim), np.float32)
            ),
            "rewards": np.empty((k, t_len), np.float32),
            "dones": np.zeros((k, t_len), np.uint8),
            "logp": np.empty((k, t_len), np.float32),
            "versions": np.empty((k, t_len), np.int32),
        }
        for g, envs in enumerate(self.groups):
            self.policy.request(g, self.obs[envs])
        for t in range(t_len):
            truncated_final: list[tuple[int, np.ndarray]] = []
            for g, envs in enumerate(self.groups):
                t0 = time.perf_counter()
                act, lp, version = self.policy.actions(g)
                t1 = time.perf_counter()
                buf["obs"][envs, t], buf["actions"][envs, t] = self.obs[envs], act
                buf["logp"][envs, t], buf["versions"][envs, t] = lp, version
                self._step(envs, act, t, buf, truncated_final)
                self.policy_s += t1 - t0
                self.env_s += time.perf_counter() - t1
                self._check_finite(envs, t, buf)
                if self.reward_norm is not None:  # what the learner sees; episodes stay raw
                    rewards = buf["rewards"][envs, t]
                    buf["rewards"][envs, t] = self.reward_norm(envs, rewards, buf["dones"][envs, t])
                if t + 1 < t_len:
                    self.policy.request(g, self.obs[envs])
            if truncated_final:
                idx = [i for i, _ in truncated_final]
                finals = np.stack([o for _, o in truncated_final])
                bad = ~np.isfinite(finals).all(axis=1)
                if bad.any():  # its value would be a non-finite reward
                    i = idx[int(np.flatnonzero(bad)[0])]
                    raise NonFiniteEnv(
                        f"env {self.cfg.env}, actor {self.index}, env {i}: non-finite final "
                        "observation of an episode cut by its time limit (after "
                        f"{int(self.stepped.value)} steps of this actor); nothing of it was "
                        "trained on"
                    )
                values = self.policy.value(finals)
                buf["rewards"][idx, t] += gamma * values / scale
            self.stepped.value += k
        buf["obs"][:, t_len] = self.obs
        return buf

    def _check_finite(self, envs: slice, t: int, buf: dict[str, np.ndarray]) -> None:
        """Raises ``NonFiniteEnv`` naming the env, this actor and the step where one of
        ``envs`` returned a non-finite observation or reward (nothing of it is sent)."""
        obs, rewards = self.obs[envs], buf["rewards"][envs, t]
        if np.isfinite(obs).all() and np.isfinite(rewards).all():
            return
        bad = np.flatnonzero(~(np.isfinite(obs).all(axis=1) & np.isfinite(rewards)))[0]
        i = range(*envs.indices(self.envs.k))[int(bad)]
        what = "reward" if not np.isfinite(rewards[bad]) else "observation"
        raise NonFiniteEnv(
            f"env {self.cfg.env}, actor {self.index}, env {i}: non-finite {what} at step "
            f"{int(self.ep_length[i])} of its episode (after {int(self.stepped.value)} steps of "
            "this actor); nothing of it was trained on"
        )

    def _step(
        self,
        envs: slice,
        act: np.ndarray,
        t: int,
        buf: dict[str, np.ndarray],
        truncated_final: list[tuple[int, np.ndarray]],
    ) -> None:
        """Steps the environments ``envs`` with ``act``; appends truncated episodes' final
        observations (to bootstrap from) to ``truncated_final``."""
        env_act = act if self.info.discrete else np.clip(act, self.act_low, self.act_high)
        lo, hi, _ = envs.indices(self.envs.k)
        out = self.envs.step(lo, hi, env_act)
        buf["rewards"][lo:hi, t] = out.rewards
        self.ep_return[lo:hi] += out.rewards
        self.ep_length[lo:hi] += 1
        for j in np.flatnonzero(out.terminated | out.truncated):
            i = lo + int(j)
            buf["dones"][i, t] = 1
            if out.truncated[j] and not out.terminated[j]:
                truncated_final.append((i, out.final_obs[int(j)]))
            self.episodes.append([float(self.ep_return[i]), int(self.ep_length[i])])
            self.ep_return[i], self.ep_length[i] = 0.0, 0
        self.obs[lo:hi] = out.obs

    def report(self, final: bool = False) -> None:
        if self.stats is None:
            return
        counters = {
            "stepped": int(self.stepped.value),
            "messages": self.dispenser.messages,
            "bytes": self.dispenser.bytes,
            "rollouts": self.dispenser.seq,
            "episodes": self.episodes,
            "version": self.policy.version,
            "throttle_waits": self.waits,
            "unconfirmed_steps": self.sent_steps - self.receipts.received,
            "throttle_s": round(self.throttle_s, 3),
            "dispatch_s": round(self.dispatch_s, 3),
            "env_s": round(self.env_s, 3),
            "policy_s": round(self.policy_s, 3),
            "cpu_s": round(time.process_time() - self.cpu_0, 3),
            "live_epoch": self.live.epoch,
            "malformed": self.malformed.count
            + self.receipts.malformed.count
            + (self.policy.weights.malformed.count if isinstance(self.policy, LocalPolicy) else 0),
            "final": final,
        }
        if isinstance(self.policy, RemotePolicy):
            counters["inference_wait_s"] = self.policy.waited_s
        self.stats.send(counters)
        self.episodes = []

    def run(self, stop: Any) -> None:
        """Collects and dispatches rollouts until ``stop`` is set (checked between rollouts)."""
        last_stats = time.monotonic()
        steps = self.cfg.envs_per_actor * self.cfg.rollout_len
        while not stop.is_set():
            rollout = self.collect()
            t0 = time.monotonic()
            self.dispenser.dispatch(rollout, steps)  # blocks while the stages push back
            t1 = time.monotonic()
            self.sent_steps += steps
            self._take_live_settings()
            last_stats = self._throttle(stop, last_stats)
            self.dispatch_s += t1 - t0
            self.throttle_s += time.monotonic() - t1
            if time.monotonic() - last_stats >= STATS_INTERVAL_S:
                self.report()
                last_stats = time.monotonic()
        self.dispenser.end_of_stream()
        self._await_delivery(self.sent_steps)
        self.report(final=True)
        self.envs.close()

    def _throttle(self, stop: Any, last_stats: float) -> float:
        """Waits while more than ``budget`` steps sent are unconfirmed (back-pressure: the
        learner is behind), reporting every ``STATS_INTERVAL_S`` meanwhile, so that an actor
        whose steps are never confirmed shows as waiting, with its unconfirmed steps, instead
        of going silent. Returns when the last report was sent."""
        while self.sent_steps - self.receipts.poll() > self.budget and not stop.is_set():
            self.waits += 1
            self.receipts.poll(THROTTLE_POLL_MS)
            self.policy.poll()
            self._take_live_settings()
            if time.monotonic() - last_stats >= STATS_INTERVAL_S:
                self.report()
                last_stats = time.monotonic()
        return last_stats

    def _take_live_settings(self) -> None:
        if self.commands is None:
            return
        settings = self.live.poll(self.commands, self.malformed)
        if settings is not None:  # at least one rollout in flight, as at the start
            rollout = self.cfg.envs_per_actor * self.cfg.rollout_len
            self.budget = max(rollout, settings["inflight_steps_per_actor"])

    def _await_delivery(self, sent: int) -> None:
        """Waits until the receipts cover every step sent, before the socket closes.

        A ZeroMQ socket closed while its peer is applying back-pressure can drop its queued
        tail even with LINGER set, so a clean exit waits for the receipt instead.
        """
        start, parent = time.monotonic(), os.getppid()
        while self.receipts.poll(THROTTLE_POLL_MS) < sent:
            waited = time.monotonic() - start
            orphaned = os.getppid() != parent and waited > DELIVERY_TIMEOUT_S
            if orphaned or waited > DELIVERY_CEILING_S:
                logger.error(
                    "actor %s: %d of %d steps unconfirmed after %.0f s%s",
                    self.receipts.key,
                    sent - self.receipts.received,
                    sent,
                    waited,
                    " (its runner is gone)" if orphaned else "",
                )
                return
