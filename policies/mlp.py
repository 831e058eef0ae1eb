"""MLP spec strings: ``"60:256:128:64:8"`` = input 60, hidden 256/128/64, output 8.

``auto`` stands for the environment's sizes: ``"auto"`` alone is ``auto:64:64:auto``, and
``auto`` may replace the first (observation size) or last (action size) entry of a spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # parsing a spec needs no torch (the probes' actor loop runs without it)
    from torch import nn

DEFAULT_HIDDEN = (64, 64)


class PolicySpecError(ValueError):
    """A policy spec string that is malformed or does not fit the environment."""


def parse_spec(spec: str, obs_dim: int, act_dim: int) -> list[int]:
    """Resolves a spec string into layer sizes ``[obs_dim, *hidden, act_dim]``.

    Args:
        spec: Colon-separated sizes, ``auto`` allowed at either end, or ``auto`` alone.
        obs_dim: The flattened observation size of the environment.
        act_dim: Logits (discrete) or action dimensions (continuous) the policy must output.

    Raises:
        PolicySpecError: The spec is malformed or its ends do not match the environment.
    """
    text = spec.strip()
    if text == "auto":
        return [obs_dim, *DEFAULT_HIDDEN, act_dim]
    parts = text.split(":")
    if len(parts) < 2:
        raise PolicySpecError(
            f"policy spec {spec!r} needs at least input:output sizes, e.g. "
            f"'{obs_dim}:64:64:{act_dim}' or 'auto:64:64:auto' or 'auto'"
        )
    sizes: list[int] = []
    for i, part in enumerate(parts):
        if part == "auto" and i in (0, len(parts) - 1):
            sizes.append(obs_dim if i == 0 else act_dim)
            continue
        if not part.isdigit() or int(part) <= 0:
            raise PolicySpecError(
                f"policy spec {spec!r}: entry {i} is {part!r}; allowed: positive integers "
                "('auto' only as the first or last entry)"
            )
        sizes.append(int(part))
    if sizes[0] != obs_dim:
        raise PolicySpecError(
            f"policy spec {spec!r} takes {sizes[0]} inputs but the environment's observations "
            f"have {obs_dim} values; use {obs_dim} or 'auto' as the first entry"
        )
    if sizes[-1] != act_dim:
        raise PolicySpecError(
            f"policy spec {spec!r} gives {sizes[-1]} outputs but the environment needs "
            f"{act_dim}; use {act_dim} or 'auto' as the last entry"
        )
    return sizes


def build_mlp(sizes: list[int], activation: type[nn.Module] | None = None) -> nn.Sequential:
    """An MLP with ``activation`` (default tanh) between layers and a linear output layer."""
    from torch import nn

    activation = activation or nn.Tanh
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)
