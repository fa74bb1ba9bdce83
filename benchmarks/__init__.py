"""Benchmarks: each bench_*.py module has `run()` returning rows; `python -m benchmarks` prints them all."""
