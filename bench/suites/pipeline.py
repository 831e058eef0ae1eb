"""The experience path alone, on synthetic rollouts: the four stages vs simpler transports.

    python -m bench pipeline --producers 8 --seconds 3 --out out/pipeline

For each rollout size (one step each), side by side in one run (same producers, same payload):
  raw        pyzmq PUSH/PULL of one opaque frame per rollout (the transport's ceiling)
  per-rollout one wire message per rollout (all channels as frames), straight to the consumer
  stages-1   dispenser -> compressor -> migrator -> batcher with chunk_bytes=1 (no concatenation)
  stages     the same with the compressor concatenating up to --chunk-bytes
The consumer reports rollouts/s, payload MB/s and messages/s it received; the Markdown table
closes the run (``bench/pipeline_throughput.py``).
"""

from __future__ import annotations

import argparse

from bench.pipeline_throughput import SIZES, size_rows, table
from bench.suite import Step

NAME = "pipeline"
HELP = "the stage pipeline on synthetic rollouts, beside raw pyzmq and simpler transports"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per mode")
    ap.add_argument("--chunk-bytes", type=int, default=256 * 1024)
    ap.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.producers < 1 or a.seconds <= 0 or a.chunk_bytes < 1:
        ap.error("--producers and --chunk-bytes must be >= 1 and --seconds > 0")


def plan(a: argparse.Namespace):
    def run(name: str) -> dict:
        return {
            "producers": a.producers,
            "seconds": a.seconds,
            "chunk_bytes": a.chunk_bytes,
            "rows": size_rows(name, a.producers, a.seconds, a.chunk_bytes),
        }

    steps = [Step(n, lambda n=n: run(n), 4 * (a.seconds + 8)) for n in a.sizes]

    def finish(results: dict) -> None:
        print(table([r for n in a.sizes for r in results[n]["rows"]]))

    return steps, finish
