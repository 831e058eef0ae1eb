"""V-trace off-policy targets (Espeholt et al. 2018, IMPALA), batch-major ``[N, T]`` tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VTraceReturns:
    """``vs``: value targets; ``pg_advantages``: advantages for the policy gradient."""

    vs: torch.Tensor
    pg_advantages: torch.Tensor


@torch.no_grad()
def vtrace(
    behavior_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> VTraceReturns:
    """Computes V-trace targets for trajectories of length T.

    Args:
        behavior_logp: ``[N, T]`` log-probs of the taken actions under the actor's policy.
        target_logp: ``[N, T]`` log-probs under the learner's current policy.
        rewards: ``[N, T]``.
        values: ``[N, T]`` current value estimates V(x_t).
        bootstrap_value: ``[N]`` V(x_T).
        discounts: ``[N, T]`` gamma * (1 - done_t).
        rho_bar: Clip of the importance weights in the TD errors.
        c_bar: Clip of the trace-cutting coefficients.
        lam: Trace decay (IMPALA's lambda): ``c_t = lam * min(c_bar, rho_t)``. 1.0 is plain
            V-trace. On-policy the value targets ``vs`` are GAE(lambda)'s returns; the policy
            gradient's advantage is IMPALA's, ``r_t + gamma * vs_{t+1} - V(x_t)``, whose first
            step carries no lambda (so it is not GAE's advantage unless lambda is 1).
    """
    rhos = torch.exp(target_logp - behavior_logp)
    clipped_rhos = rhos.clamp(max=rho_bar)
    cs = lam * rhos.clamp(max=c_bar)
    values_tp1 = torch.cat([values[:, 1:], bootstrap_value[:, None]], dim=1)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    acc = torch.zeros_like(bootstrap_value)
    vs_minus_v = torch.empty_like(values)
    for t in range(values.shape[1] - 1, -1, -1):
        acc = deltas[:, t] + discounts[:, t] * cs[:, t] * acc
        vs_minus_v[:, t] = acc
    vs = vs_minus_v + values
    vs_tp1 = torch.cat([vs[:, 1:], bootstrap_value[:, None]], dim=1)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
