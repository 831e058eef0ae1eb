"""Wrapping a user's training script: one fresh run per trial (restart mode) or one run tuned live."""
