"""A plain single-file PPO (CleanRL style) on gymnasium vector envs, tunable by ``autotune wrap``.

Alone:                python examples/ppo_gymnasium.py --total-steps 50000
Restart mode (flags): autotune wrap --knob num_envs=2,4,8,16 --knob batch_size=256,512,1024 \\
                          --knob threads=1,2 --trials 12 --trial-s 60 -- \\
                          python examples/ppo_gymnasium.py --num-envs {num_envs} \\
                          --batch-size {batch_size} --threads {threads}
Live mode:            autotune wrap --mode live --knob num_envs=2,4,8,16 --knob threads=1,2 \\
                          --window-s 10 -- python examples/ppo_gymnasium.py --total-steps 2000000

It reads its knobs once through ``autotune.client.knobs`` (its flags are the defaults), reports
its running total of env steps after every update, and between updates calls
``client.poll()``: new knobs rebuild the envs and set torch's threads and device in place.
Knobs: num_envs, batch_size (env steps per update; rollout length = batch_size / num_envs),
threads (torch intra-op threads), device (cpu or cuda).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from autotune import client


def make_envs(env_id: str, n: int, seed: int) -> gym.vector.VectorEnv:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    envs.reset(seed=seed)
    return envs


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(obs_dim, 64),
            nn.Tanh(),
            nn.Linear(64, 64),
            nn.Tanh(),
            nn.Linear(64, n_actions),
        )
        self.critic = nn.Sequential(
            nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
        )

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.actor(obs))
        action = dist.sample()
        return action, dist.log_prob(action), self.critic(obs).squeeze(-1)


def ppo_update(
    agent: Agent,
    opt: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    epochs: int = 4,
    minibatches: int = 4,
    clip: float = 0.2,
) -> None:
    n = batch["obs"].shape[0]
    for _ in range(epochs):
        for idx in torch.randperm(n, device=batch["obs"].device).chunk(minibatches):
            dist = torch.distributions.Categorical(logits=agent.actor(batch["obs"][idx]))
            ratio = (dist.log_prob(batch["actions"][idx]) - batch["logp"][idx]).exp()
            adv = batch["adv"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
            v = agent.critic(batch["obs"][idx]).squeeze(-1)
            loss = pg + 0.5 * ((v - batch["ret"][idx]) ** 2).mean() - 0.01 * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            opt.step()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--total-steps", type=int, default=100_000)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    knobs = client.knobs(
        {
            "num_envs": args.num_envs,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "device": args.device,
        }
    )
    torch.manual_seed(args.seed)
    torch.set_num_threads(int(knobs["threads"]))
    device = torch.device(knobs["device"])
    envs = make_envs(args.env, int(knobs["num_envs"]), args.seed)
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n).to(device)
    opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    obs, _ = envs.reset(seed=args.seed)
    steps, returns, ep_ret, start = 0, [], np.zeros(envs.num_envs), time.time()
    gamma, lam = 0.99, 0.95
    while steps < args.total_steps:
        n_envs = envs.num_envs
        horizon = max(1, int(knobs["batch_size"]) // n_envs)
        buf = {k: [] for k in ("obs", "actions", "logp", "values", "rewards", "dones")}
        for _ in range(horizon):
            o = torch.as_tensor(obs, dtype=torch.float32, device=device)
            with torch.no_grad():
                action, logp, value = agent.act(o)
            obs, reward, term, trunc, _ = envs.step(action.cpu().numpy())
            done = term | trunc
            ep_ret += reward
            returns += list(ep_ret[done])
            ep_ret[done] = 0.0
            for k, v in zip(
                ("obs", "actions", "logp", "values"), (o, action, logp, value), strict=True
            ):
                buf[k].append(v)
            buf["rewards"].append(torch.as_tensor(reward, dtype=torch.float32, device=device))
            buf["dones"].append(torch.as_tensor(done, dtype=torch.float32, device=device))
        with torch.no_grad():
            next_v = agent.critic(torch.as_tensor(obs, dtype=torch.float32, device=device))
            next_v = next_v.squeeze(-1)
        adv, last = torch.zeros(horizon, n_envs, device=device), 0.0
        for t in reversed(range(horizon)):
            nv = next_v if t == horizon - 1 else buf["values"][t + 1]
            nonterminal = 1.0 - buf["dones"][t]
            delta = buf["rewards"][t] + gamma * nv * nonterminal - buf["values"][t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        values = torch.stack(buf["values"])
        batch = {
            "obs": torch.stack(buf["obs"]).flatten(0, 1),
            "actions": torch.stack(buf["actions"]).flatten(),
            "logp": torch.stack(buf["logp"]).flatten(),
            "adv": adv.flatten(),
            "ret": (adv + values).flatten(),
        }
        ppo_update(agent, opt, batch)
        steps += horizon * n_envs
        client.report(steps=steps, episode_return=float(np.mean(returns[-20:]) if returns else 0))
        new = client.poll()  # a safe point: between updates
        if new is not None:
            knobs = client.knobs()
            torch.set_num_threads(int(knobs["threads"]))
            if torch.device(knobs["device"]) != device:
                device = torch.device(knobs["device"])
                agent.to(device)
                opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
            if int(knobs["num_envs"]) != envs.num_envs:
                envs.close()
                envs = make_envs(args.env, int(knobs["num_envs"]), args.seed + steps)
                obs, _ = envs.reset()
                ep_ret = np.zeros(envs.num_envs)
    mean = np.mean(returns[-20:]) if returns else float("nan")
    print(f"{steps} steps in {time.time() - start:.1f} s; mean return (last 20) {mean:.1f}")
    envs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
