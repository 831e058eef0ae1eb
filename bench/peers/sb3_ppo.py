"""Stable-Baselines3 PPO as a user would run it on MuJoCo, as a benchmark peer.

    python -m bench.peers.sb3_ppo --env Ant-v5 --num-envs 16 --device cuda --net 256,128,64 \\
        --seconds 60 --progress sb3.jsonl

The RL Zoo's MuJoCo settings: SubprocVecEnv with ``--num-envs`` processes and VecNormalize
(observations and rewards), rollouts of 2048 steps in all (``n_steps`` = 2048 / num_envs per env),
minibatches of 64, 10 epochs, lr 3e-4, GAE 0.95. The policy and the value function are separate
tanh MLPs of ``--net`` sizes. The progress curve counts trained steps: it is written when a
rollout starts, after the previous rollout's update; returns are SB3's (Monitor, last 100
episodes, unnormalised rewards).

``--checkpoint DIR`` makes a run resumable across commands: when it stops early
(``--seconds``) it saves the model, its optimiser and the VecNormalize statistics there, and a
later run with the same ``--checkpoint`` goes on from them toward the same ``--total-steps``,
appending to the same progress curve.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.peers.common import StopRule, add_peer_args, check_peer_args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_peer_args(ap)
    ap.add_argument("--rollout", type=int, default=2048, help="steps per rollout, all envs")
    ap.add_argument("--batch-size", type=int, default=64, help="SB3's minibatch size")
    ap.add_argument("--dummy", action="store_true", help="DummyVecEnv (one process) instead")
    ap.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="save here when stopped by --seconds; resume from here when it holds a save",
    )
    a = ap.parse_args(argv)
    check_peer_args(ap, a)
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from autotune.workflows.progress_log import ProgressLog

    torch.set_num_threads(a.threads)
    saved = Path(a.checkpoint) if a.checkpoint else None
    resume = saved is not None and (saved / "model.zip").is_file()
    log = ProgressLog(a.progress, append=resume) if a.progress else None

    class Progress(BaseCallback):
        stop: StopRule
        trained = 0  # steps sampled before the current rollout: all trained

        def _on_training_start(self) -> None:
            self.stop = StopRule(a, self.num_timesteps)

        def _on_step(self) -> bool:
            return not self.stop.due(self.trained)

        def _on_rollout_start(self) -> None:
            self.trained = self.num_timesteps
            self.stop.line(self.num_timesteps)
            if log:
                buf = self.model.ep_info_buffer
                ret = sum(ep["r"] for ep in buf) / len(buf) if buf else None
                log.write(self.num_timesteps, ret, None, force=True)

    env = make_vec_env(
        a.env, n_envs=a.num_envs, seed=a.seed, vec_env_cls=DummyVecEnv if a.dummy else SubprocVecEnv
    )
    if resume:
        env = VecNormalize.load(str(saved / "vecnormalize.pkl"), env)
        model = PPO.load(saved / "model.zip", env=env, device=a.device)
        print(f"resumed from {saved} at {model.num_timesteps} steps", flush=True)
    else:
        env = VecNormalize(env, gamma=0.99)
        model = new_model(a, env, PPO, torch)
    left, progress = a.total_steps - model.num_timesteps, Progress()
    progress.trained = model.num_timesteps
    if left > 0:
        model.learn(total_timesteps=left, callback=progress, reset_num_timesteps=not resume)
    buf = model.ep_info_buffer
    ret = sum(ep["r"] for ep in buf) / len(buf) if buf else None
    done = model.num_timesteps >= a.total_steps
    if log:  # the last rollout was trained only if learn() was not stopped inside it
        if done:
            log.write(model.num_timesteps, ret, None, force=True)
        log.close()
    if saved is not None and not done:
        # learn() stopped inside a rollout: its steps were not trained, so they are not
        # counted; the resumed run collects that rollout again
        model.num_timesteps = progress.trained
        saved.mkdir(parents=True, exist_ok=True)
        model.save(saved / "model.zip")
        env.save(str(saved / "vecnormalize.pkl"))
        print(f"saved to {saved} at {model.num_timesteps} steps", flush=True)
    print(f"sb3 ppo {a.env}: {model.num_timesteps} steps sampled, mean return {ret}")
    env.close()
    return 0


def new_model(a: argparse.Namespace, env, PPO, torch):  # the PPO class; env a VecEnv
    return PPO(
        "MlpPolicy",
        env,
        n_steps=max(1, a.rollout // a.num_envs),
        batch_size=a.batch_size,
        n_epochs=10,
        learning_rate=3e-4,
        gae_lambda=0.95,
        policy_kwargs={
            "net_arch": {"pi": a.hidden, "vf": a.hidden},
            "activation_fn": torch.nn.Tanh,
        },
        device=a.device,
        seed=a.seed,
        verbose=0,
    )


if __name__ == "__main__":
    raise SystemExit(main())
