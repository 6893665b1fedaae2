"""Benchmarks: `python -m benchmarks run [--bench NAME]` (what `make bench` runs).

Speed is measured here, never by timed tests, and always as a ratio against a baseline measured
in the same run (these machines are noisy). Every side of a comparison runs in its own process,
so its peak memory is its own and no TensorFlow state (mixed-precision policy, XLA, caches)
leaks from one side to the other. The runner itself never imports TensorFlow.
"""
