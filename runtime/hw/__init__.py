"""Hardware access: NVML (the only pynvml importer, where NVML errors are translated), the GPU
inventory, and NVIDIA MPS control."""
