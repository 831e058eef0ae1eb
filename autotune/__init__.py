"""autotune: tunes the CPU actors and GPU trainer slices of RL training for env steps per joule."""

from __future__ import annotations

__version__ = "0.1.0"
