"""Benchmarks: each prints its own numbers against a baseline measured in the same run (see README)."""
