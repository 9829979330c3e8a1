"""Benchmark suite behind `hispec bench`."""
