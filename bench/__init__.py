"""Benchmarks behind `make bench` (bench/run.py): one module per comparison, each exposing run(quick)."""
