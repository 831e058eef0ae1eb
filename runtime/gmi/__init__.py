"""GPU multiplexing instances: trainer processes bound to slices of GPUs."""
