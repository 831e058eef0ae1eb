"""The error a learner update raises when it meets a non-finite value (torch-free, so the
trainer module can catch it without importing torch)."""

from __future__ import annotations


class NonFiniteUpdate(ArithmeticError):
    """An update met a non-finite value (observation statistics or a gradient); the optimiser
    step that would take it is not made, so the weights and the optimiser state stay finite,
    and the version is not bumped."""
