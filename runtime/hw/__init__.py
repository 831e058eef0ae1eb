"""Hardware access: NVML (the only pynvml importer), GPU inventory, and NVIDIA MPS control."""
