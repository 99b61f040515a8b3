"""Section 5 — the CI soak: 60 s at ~70% of capacity on the session server (the 10-minute soak with its RSS and
P99 plot is tests/reliability/scripts/soak.py).
"""

from __future__ import annotations

import json

from tests.reliability import relkit

SLOTS = relkit.TEST_LIMITS["max_batch_size"]
DURATION_S = 60


def test_soak_60_s_at_70_percent_of_capacity(triton):
    result = relkit.soak(triton, fraction=0.7, duration_s=DURATION_S, max_tokens=64, slots=SLOTS,
                         window_s=10)
    r = result["report"]
    print("\nsoak 60 s:", json.dumps(r))
    assert r.get("n_error", 0) == r.get("n_timeout", 0) == r.get("n_rejected", 0) == 0, r["errors"]
    assert r["n_ok"] >= 0.6 * r["offered_rps"] * DURATION_S
    assert r["rss_growth_pct"] < 10
    assert r["window_p99_ms_max"] < 10 * max(r["window_p99_ms_median"], 50)  # no runaway latency
    assert relkit.idle(triton.urls.metrics, timeout=30).active == 0
