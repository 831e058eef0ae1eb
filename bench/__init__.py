"""Benchmarks; each script writes JSON and prints a Markdown table for docs/BENCHMARKS.md."""
