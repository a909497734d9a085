"""Helpers shared by the tests, the benchmarks and the scripts: a live server, PyTorch references."""
