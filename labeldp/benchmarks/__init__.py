"""Benchmark drivers behind ``labeldp bench``: privacy-utility curves on real data, classification protocols and
LabelDP-Pro. Speed benchmarks live in the repository's ``bench/`` scripts."""
