"""Stable-Baselines3 PPO, tunable by ``autotune wrap`` in restart mode (the ``sb3`` extra).

Alone:   python examples/sb3_ppo.py --total-steps 50000
Tuned:   autotune wrap --knob num_envs=2,4,8 --knob n_steps=64,128,256 --knob threads=1,2 \\
             --knob device=cpu,cuda --trials 12 --trial-s 90 -- python examples/sb3_ppo.py

It reads its knobs once (``autotune.client.knobs``, its flags as defaults): num_envs (vector
envs), n_steps (rollout length per env, so a rollout is num_envs x n_steps steps), batch_size
(SB3's minibatch), threads (torch intra-op threads) and device; ``--subproc`` steps the envs in
SB3's SubprocVecEnv. A callback reports SB3's step count after every rollout.
"""

from __future__ import annotations

import argparse

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

from autotune import client


class ReportSteps(BaseCallback):
    """Tells the wrapper the running total of env steps after each rollout."""

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        returns = [ep["r"] for ep in self.model.ep_info_buffer] if self.model.ep_info_buffer else []
        mean = sum(returns) / len(returns) if returns else 0.0
        client.report(steps=self.num_timesteps, episode_return=mean)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--total-steps", type=int, default=100_000)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--n-steps", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--subproc", action="store_true", help="SubprocVecEnv instead of Dummy")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    k = client.knobs(
        {
            "num_envs": args.num_envs,
            "n_steps": args.n_steps,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "device": args.device,
        }
    )
    torch.set_num_threads(int(k["threads"]))
    env = make_vec_env(
        args.env,
        n_envs=int(k["num_envs"]),
        seed=args.seed,
        vec_env_cls=SubprocVecEnv if args.subproc else DummyVecEnv,
    )
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=int(k["n_steps"]),
        batch_size=int(k["batch_size"]),
        device=k["device"],
        seed=args.seed,
        verbose=0,
    )
    model.learn(total_timesteps=args.total_steps, callback=ReportSteps())
    returns = [ep["r"] for ep in model.ep_info_buffer]
    mean = sum(returns) / len(returns) if returns else float("nan")
    print(f"{model.num_timesteps} steps; mean return (last {len(returns)}) {mean:.1f}")
    env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
