"""Policies and learners: MLP actor-critics built from spec strings, and the APPO/V-trace learner.

Importing this package imports no torch; its modules do. The actors use `numpy_policy` only,
so actor and stage processes never import torch.
"""
