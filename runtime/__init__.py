"""The training runtime: actor processes, the four experience stages, and the trainer GMI.

Package imports stay light (no torch) so the compressor and migrator processes start fast.
"""
