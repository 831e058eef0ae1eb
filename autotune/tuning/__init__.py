"""Tuning: the knob space, what a window measures, the online tuner and the offline study,
over an Optuna storage."""
