"""The control plane: one protocol for every message, the daemon, a training job's link to it,
a wrapped script's client, and the status document."""
