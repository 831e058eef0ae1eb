"""The four experience stages, one module each (dispenser per actor, compressor and migrator
system-wide, batcher per trainer), and the process set-up and telemetry sender that every
runtime process shares (``common``)."""
