"""A single-file PPO in CleanRL's style (``ppo_continuous_action.py``) on gymnasium's
AsyncVectorEnv, as a benchmark peer.

    python -m bench.peers.cleanrl_ppo --env Ant-v5 --num-envs 16 --device cuda \\
        --net 256,128,64 --seconds 60 --progress cleanrl.jsonl

CleanRL's settings and per-env wrappers: ClipAction, NormalizeObservation (clipped to +-10),
NormalizeReward (clipped to +-10); rollouts of 2048 steps in all (2048 / num_envs per env),
32 minibatches, 10 epochs, lr 3e-4 annealed to 0 over ``--total-steps``, GAE 0.95, advantage
normalisation, clipped value loss, orthogonal init. One change for gymnasium 1.x: envs reset in
the same step (``AutoresetMode.SAME_STEP``), the semantics CleanRL was written for. Continuous
action spaces only. Returns are of unnormalised rewards, mean of the last 100 episodes; the
progress curve is written after each update (trained steps).
"""

from __future__ import annotations

import argparse
import itertools
from collections import deque

import gymnasium as gym
import numpy as np

from bench.peers.common import StopRule, add_peer_args, check_peer_args


def make_env(env_id: str, gamma: float):
    def thunk() -> gym.Env:
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(
            env, lambda o: np.clip(o, -10, 10), env.observation_space
        )
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        return gym.wrappers.TransformReward(env, lambda r: np.clip(r, -10, 10))

    return thunk


def build_agent(obs_dim: int, act_dim: int, hidden: list[int]):
    import torch
    from torch import nn

    def layer(i: int, o: int, std: float = np.sqrt(2)) -> nn.Linear:
        lin = nn.Linear(i, o)
        nn.init.orthogonal_(lin.weight, std)
        nn.init.constant_(lin.bias, 0.0)
        return lin

    def mlp(out: int, std: float) -> nn.Sequential:
        sizes, mods = [obs_dim, *hidden], []
        for i, o in itertools.pairwise(sizes):
            mods += [layer(i, o), nn.Tanh()]
        return nn.Sequential(*mods, layer(sizes[-1], out, std))

    class Agent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.critic = mlp(1, 1.0)
            self.actor_mean = mlp(act_dim, 0.01)
            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

        def get_value(self, x: torch.Tensor) -> torch.Tensor:
            return self.critic(x)

        def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
            mean = self.actor_mean(x)
            dist = torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp())
            if action is None:
                action = dist.sample()
            return (action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.critic(x))

    return Agent()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_peer_args(ap)
    ap.add_argument("--rollout", type=int, default=2048, help="steps per rollout, all envs")
    ap.add_argument("--minibatches", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args(argv)
    check_peer_args(ap, a)
    import torch
    from torch import nn

    from autotune.workflows.progress_log import ProgressLog

    gamma, lam, clip, ent_coef, vf_coef, max_grad = 0.99, 0.95, 0.2, 0.0, 0.5, 0.5
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = torch.device(a.device)
    envs = gym.vector.AsyncVectorEnv(
        [make_env(a.env, gamma) for _ in range(a.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        ap.error(
            f"{a.env} has a {type(envs.single_action_space).__name__} action space; this "
            "peer (CleanRL's ppo_continuous_action) takes continuous (Box) actions only"
        )
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    agent = build_agent(obs_dim, act_dim, a.hidden).to(dev)
    opt = torch.optim.Adam(agent.parameters(), lr=a.lr, eps=1e-5)
    n_steps = max(1, a.rollout // a.num_envs)
    batch = n_steps * a.num_envs
    mb = max(1, batch // a.minibatches)
    updates = -(-a.total_steps // batch)  # enough updates to reach --total-steps
    obs_buf = torch.zeros((n_steps, a.num_envs, obs_dim), device=dev)
    act_buf = torch.zeros((n_steps, a.num_envs, act_dim), device=dev)
    logp_buf, rew_buf, done_buf, val_buf = (
        torch.zeros((n_steps, a.num_envs), device=dev) for _ in range(4)
    )
    returns: deque[float] = deque(maxlen=100)
    episodes, steps = 0, 0
    log = ProgressLog(a.progress, every_s=0.0) if a.progress else None
    next_obs = torch.as_tensor(envs.reset(seed=a.seed)[0], dtype=torch.float32, device=dev)
    next_done = torch.zeros(a.num_envs, device=dev)
    if log:
        log.write(0, None, 0, force=True)
    stop = StopRule(a)
    for update in range(updates):
        if stop.due(steps):
            break
        opt.param_groups[0]["lr"] = a.lr * (1.0 - update / updates)
        for t in range(n_steps):
            obs_buf[t], done_buf[t] = next_obs, next_done
            with torch.no_grad():
                action, logp, _, value = agent.get_action_and_value(next_obs)
            val_buf[t], act_buf[t], logp_buf[t] = value.flatten(), action, logp
            obs, reward, term, trunc, info = envs.step(action.cpu().numpy())
            rew_buf[t] = torch.as_tensor(reward, dtype=torch.float32, device=dev)
            next_obs = torch.as_tensor(obs, dtype=torch.float32, device=dev)
            next_done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32, device=dev)
            final = info.get("final_info", {})  # SAME_STEP: finished episodes' infos
            if "episode" in final:
                for r in final["episode"]["r"][final["_episode"]]:
                    returns.append(float(r))
                    episodes += 1
        with torch.no_grad():  # GAE, as CleanRL computes it
            next_value = agent.get_value(next_obs).reshape(1, -1)
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(a.num_envs, device=dev)
            for t in reversed(range(n_steps)):
                nonterminal = 1.0 - (next_done if t == n_steps - 1 else done_buf[t + 1])
                nextv = next_value if t == n_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + gamma * nextv * nonterminal - val_buf[t]
                last = delta + gamma * lam * nonterminal * last
                adv[t] = last
            ret_buf = adv + val_buf
        b_obs, b_act = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1, act_dim)
        b_logp, b_adv = logp_buf.reshape(-1), adv.reshape(-1)
        b_ret, b_val = ret_buf.reshape(-1), val_buf.reshape(-1)
        for _ in range(a.epochs):
            perm = torch.randperm(batch, device=dev)
            for start in range(0, batch, mb):
                idx = perm[start : start + mb]
                _, newlogp, entropy, newv = agent.get_action_and_value(b_obs[idx], b_act[idx])
                ratio = (newlogp - b_logp[idx]).exp()
                madv = b_adv[idx]
                madv = (madv - madv.mean()) / (madv.std() + 1e-8)
                pg = torch.max(-madv * ratio, -madv * ratio.clamp(1 - clip, 1 + clip)).mean()
                newv = newv.view(-1)
                v_clipped = b_val[idx] + (newv - b_val[idx]).clamp(-clip, clip)
                v_loss = (
                    0.5 * torch.max((newv - b_ret[idx]) ** 2, (v_clipped - b_ret[idx]) ** 2).mean()
                )
                loss = pg - ent_coef * entropy.mean() + v_loss * vf_coef
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_grad)
                opt.step()
        steps += batch
        stop.line(steps)
        if log:
            log.write(steps, sum(returns) / len(returns) if returns else None, episodes, force=True)
    if log:
        log.close()
    mean = sum(returns) / len(returns) if returns else None
    print(f"cleanrl-style ppo {a.env}: {steps} trained steps, mean return {mean}")
    envs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
