"""The four experience stages: dispenser (per actor), compressor and migrator (system-wide
services), batcher (per trainer). One module each."""
