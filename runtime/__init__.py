"""The training runtime: actor processes, the four experience stages, and the trainer GMIs.

It imports ``policies`` (the layer below) and nothing of ``autotune`` (the layer above).
Package imports stay light (no torch) so the compressor and migrator processes start fast.
"""
