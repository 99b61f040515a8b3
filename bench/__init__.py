"""Benchmarks (scripts, not tests): python -m bench.engine_bench."""
