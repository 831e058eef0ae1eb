"""A user's training script under the tuner: one fresh run per trial (restart mode), or one
run tuned live."""
