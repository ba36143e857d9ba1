"""The benchmark harness of trio_worker (``python benchmarks/run.py``); see docs/benchmarks.md."""
