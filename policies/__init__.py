"""Policies and learners: MLP actor-critics built from spec strings, and the APPO/V-trace learner.

Importing this package imports torch; the runtime's stage processes do not import it.
"""
