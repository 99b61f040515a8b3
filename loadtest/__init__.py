"""Load testing and performance tooling for the served ensemble: ``python -m loadtest --help``.

perf_analyzer profiles and sweeps (``sweep``), genai-perf (``genai-perf``), locust (``locust``), a bottleneck
finder (``diagnose``), a batching/engine autotuner (``tune``) and the recorded benchmark (``report-serving``).
"""
