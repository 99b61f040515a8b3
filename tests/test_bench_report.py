"""bench/engine_report.py and the benchmark's small helpers: targets are computed from the records as the issue
defines them, and the report renders from a JSON like the one the benchmark writes."""

from __future__ import annotations

import pytest

from bench.engine_bench.options import parse_args
from bench.engine_bench.records import agreement
from bench.engine_report import compute_targets, write_markdown
from bench.workload import pct


def _records():
    def s(peer, variant, c, tok_s, model="llama-100m"):
        return {"model": model, "peer": peer, "variant": variant, "mode": "streams", "streams": c,
                "agg_tok_s": tok_s, "ttft_p50_ms": 10.0, "foreign_cores": 0.0}

    def b1(peer, variant, tok_s, model="llama-100m"):
        return {"model": model, "peer": peer, "variant": variant, "mode": "b1", "ttft_ms": 5.0,
                "decode_tok_s": tok_s, "foreign_cores": 0.1}

    return [s("hf", "fp32", 1, 20.0), s("triton", "fp32", 1, 40.0), s("triton", "fp32", 16, 300.0),
            s("engine", "fp32", 1, 45.0), s("engine", "fp32", 16, 320.0),
            b1("engine", "fp32", 40.0), b1("engine", "int8_wo", 100.0), b1("engine", "int8_sq", 90.0),
            b1("llama.cpp", "Q8_0", 125.0), b1("llama.cpp", "F32", 50.0), b1("hf", "fp32", 22.0)]


def test_targets_follow_the_issue():
    by_name = {t["target"]: t for t in compute_targets(_records(), {})}
    assert len(by_name) == 5
    int8 = by_name["best of int8_wo/int8_sq ≥ 1× llama.cpp Q8_0, batch-1 decode"]
    assert int8["variant"] == "int8_wo" and int8["value"] == pytest.approx(0.8) and not int8["met"]
    assert int8["shortfall_pct"] == pytest.approx(20.0) and not int8["noisy"]
    assert by_name["best of fp32 ≥ 1× llama.cpp F32, batch-1 decode"]["value"] == pytest.approx(0.8)
    aggregate = by_name["Triton 16 streams ≥ 4× llama.cpp Q8_0 batch 1"]
    assert aggregate["value"] == pytest.approx(300 / 125) and not aggregate["met"]
    ttft = by_name["Triton TTFT P50 at 16 streams ≤ 500 ms"]
    assert ttft["value"] == pytest.approx(50.0) and ttft["met"]
    served = by_name["Triton-served ≥ 0.9× in-process at 16 streams"]
    assert served["value"] == pytest.approx(300 / 320) and served["met"]


def test_report_renders(tmp_path):
    records = _records()
    data = {"meta": {"command": "python -m bench.engine_bench", "started": "2026-12-02T00:00:00", "duration_s": 60,
                     "load_start": [0.1, 0.2, 0.3], "load_end": [0.4, 0.5, 0.6],
                     "options": {"new_tokens": 128, "b1_reps": 3, "requests_per_stream": 2},
                     "machine": {"cpu": "cpu", "cores": 2, "isa": ["avx512f"], "memory_gb": 24, "os": "linux",
                                 "versions": {"torch": "2.13.0"}, "git": "abc", "threads": 2}},
            "models": {"llama-100m": {"checkpoint": "build/bench/models/llama-100m", "params": 96e6,
                                      "random_weights": True, "prompt_tokens_mean": 48, "config": {}}},
            "records": records, "targets": compute_targets(records, {}),
            "agreement": [{"model": "llama-100m", "peer": "engine", "variant": "fp32", "exact": 3, "of": 3,
                           "mean_prefix": 1.0}],
            "skipped": [{"peer": "llama.cpp", "reason": "not installed"}], "llama_cpp": {}}
    text = write_markdown(data, tmp_path / "engine.md").read_text()
    assert "| engine in-process | fp32 | 5.0 | 40.0 | 45.0 | 320.0 | 10 |" in text
    assert "**random weights**" in text
    assert "**no** (20% short)" in text
    assert "llama.cpp: not installed" in text
    assert "load average (1/5/15 min) | start 0.10/0.20/0.30, end 0.40/0.50/0.60" in text


def test_llama_server_rows_and_targets(tmp_path):
    """llama-server's stream levels render as a results row (aggregate per level, TTFT at the top level, peak RSS) and
    the default variant via Triton is compared with it on Q4_1; our TTFT P50 at the top level has its own target."""
    server = {"model": "default", "peer": "llama-server", "variant": "Q4_1", "mode": "streams", "rss_mb": 337.0,
              "parallel": 16, "ctx_per_slot": 512, "server_version": "version: 0.5.0-dev (build 1, commit 0c1e570)",
              "foreign_cores": 0.05}
    triton = {"model": "default", "peer": "triton", "variant": "int8_sq", "mode": "streams", "foreign_cores": 0.0}
    records = [{**server, "streams": 1, "agg_tok_s": 92.0, "ttft_p50_ms": 140.0},
               {**server, "streams": 16, "agg_tok_s": 205.0, "ttft_p50_ms": 2134.0},
               {**triton, "streams": 1, "agg_tok_s": 20.0, "ttft_p50_ms": 90.0},
               {**triton, "streams": 16, "agg_tok_s": 451.0, "ttft_p50_ms": 400.0}]
    by_name = {t["target"]: t for t in compute_targets(records, {"default_variant": "int8_sq"})}
    vs_server = by_name["16 streams via Triton, default variant ≥ 2.0× llama-server --parallel 16 on the shipped "
                        "Q4_1 GGUF"]
    assert vs_server["variant"] == "int8_sq" and vs_server["value"] == pytest.approx(451 / 205) and vs_server["met"]
    assert vs_server["detail"] == "451.0 / 205.0 tok/s"
    ttft = by_name["TTFT P50 at 16 streams ≤ 0.3 s"]
    assert ttft["value"] == pytest.approx(0.75) and not ttft["met"] and ttft["shortfall_pct"] == pytest.approx(25.0)
    assert not any(name.startswith("1 stream via Triton") for name in by_name)  # no llama.cpp Q4_1 row: no target
    b1 = {"model": "default", "mode": "b1", "ttft_ms": 40.0, "foreign_cores": 0.0}
    with_b1 = records + [{**b1, "peer": "triton", "variant": "int8_sq", "decode_tok_s": 114.0},
                         {**b1, "peer": "triton", "variant": "fp32", "decode_tok_s": 200.0},  # not the default
                         {**b1, "peer": "llama.cpp", "variant": "Q4_1", "decode_tok_s": 120.0}]
    by_name = {t["target"]: t for t in compute_targets(with_b1, {"default_variant": "int8_sq"})}
    single = by_name["1 stream via Triton, default variant ≥ 1.0× llama.cpp on the shipped Q4_1 GGUF, batch-1 decode"]
    assert single["variant"] == "int8_sq" and single["value"] == pytest.approx(0.95) and not single["met"]

    data = {"meta": {"command": "python -m bench.engine_bench", "started": "2026-12-05T00:00:00", "duration_s": 60,
                     "default_variant": "int8_sq", "options": {"new_tokens": 32, "b1_reps": 2, "requests_per_stream": 1},
                     "machine": {"cpu": "cpu", "cores": 2, "isa": [], "memory_gb": 24, "os": "linux",
                                 "versions": {}, "git": "abc", "threads": 2}},
            "models": {"default": {"checkpoint": "build/models/smollm2", "params": 134.5e6, "random_weights": False,
                                   "prompt_tokens_mean": 48, "config": {}}},
            "records": records, "targets": compute_targets(records, {"default_variant": "int8_sq"}), "llama_cpp": {}}
    text = write_markdown(data, tmp_path / "engine.md").read_text()
    assert "| llama-server (continuous batching) | Q4_1 | – | – | 92.0 | 205.0 | 2,134 | 337 | 0.05 | – |" in text
    assert ("| llama.cpp | llama-server 0.5.0-dev (build 1, commit 0c1e570): the same sdist's vendor/llama.cpp, "
            "CPU, GGML_NATIVE; --parallel 16, 512 tokens per slot |") in text
    assert ("| 16 streams via Triton, default variant ≥ 2.0× llama-server --parallel 16 on the shipped Q4_1 GGUF | "
            "default | int8_sq | 2.20× (451.0 / 205.0 tok/s) | yes |") in text
    assert "| TTFT P50 at 16 streams ≤ 0.3 s | default | int8_sq | 0.75× (400 ms) | **no** (25% short) |" in text


def test_helpers():
    assert agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 0, 6]]) == {"exact": 1, "of": 2,
                                                                        "mean_prefix": pytest.approx((1 + 1 / 3) / 2)}
    assert pct([3.0, 1.0, 2.0], 0.5) == 2.0
    quick = parse_args(["--quick"])
    assert quick.models == ["default"] and quick.streams == [1, 16] and quick.new_tokens == 32
    full = parse_args([])
    assert full.streams == [1, 4, 8, 16] and full.variants == ["fp32", "bf16", "int8_wo", "int8_sq", "int4_awq", "fp8"]
    with pytest.raises(SystemExit):
        parse_args(["--variants", "fp16"])
