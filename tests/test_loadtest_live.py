"""loadtest against real tritonservers: the session's test server (a tiny random model) and, for diagnose, a
deliberately slowed one. Each run is bounded to a few requests so the file stays within ~1 minute."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from loadtest.__main__ import main
from loadtest.slo import EXIT_OK, EXIT_SLO_FAILED


@pytest.fixture(scope="module")
def smoke_run(triton, tiny_checkpoint, tmp_path_factory):
    """One real smoke sweep (2 levels, 6 requests each) through the CLI; shared by the assertions below."""
    out = tmp_path_factory.mktemp("loadtest") / "smoke"
    code = main(["sweep", "--profile", "smoke", "--url", triton.urls.grpc, "--metrics-url", triton.urls.metrics,
                 "--tokenizer", str(tiny_checkpoint), "--out", str(out), "--quiet"])
    return code, out


def test_smoke_sweep_writes_raw_data_report_and_plots(smoke_run):
    code, out = smoke_run
    assert code == EXIT_OK, (out / "report.md").read_text() if (out / "report.md").exists() else "no report"
    for name in ("summary.json", "summary.csv", "report.md", "profile.yaml", "inputs.json", "commands.txt",
                 "throughput_vs_p99_latency.png", "ttft_percentiles.png", "tpot_percentiles.png"):
        assert (out / name).exists(), name
        assert (out / name).stat().st_size > 0
    for level in ("c1", "c2"):
        assert (out / "raw" / f"{level}.csv").exists()
        assert (out / "raw" / f"{level}.profile_export.json.gz").exists()
        assert (out / "raw" / f"preprocessing_v1.{level}.csv").exists()  # composing models' breakdown
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_OK
    for r in summary["results"]:
        assert r["ok"] and r["requests"] >= 6 and r["failed_requests"] == 0
        assert r["ttft"]["count"] == r["requests"] and r["ttft"]["p99"] > 0
        assert r["tpot"]["p50"] > 0 and r["throughput_rps"] > 0
        assert r["output_tokens_mean"] == 12  # exact output lengths: min_tokens = max_tokens
        assert 16 <= r["prompt_tokens_mean"] <= 32  # as the server counted them
        assert set(r["composing"]) == {"preprocessing", "llm"}
        assert r["metrics"]["models"]["ensemble"]["request_success"] >= r["requests"]
    with open(out / "summary.csv") as f:
        assert [row["level"] for row in csv.DictReader(f)] == ["1.0", "2.0"]
    report = (out / "report.md").read_text()
    assert "SLO met" in report and "| 2 |" in report and "perf_analyzer" in report


def test_slo_violation_sets_the_exit_code(smoke_run, triton, tiny_checkpoint, tmp_path):
    from loadtest.spec import load_profile

    strict = load_profile("smoke").model_dump(mode="json", exclude_none=True)
    strict.update(name="smoke-strict", slo={"ttft_p99_ms": 0.001, "max_error_rate": 0})
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(strict))
    code = main(["sweep", "--profile", str(path), "--url", triton.urls.grpc, "--metrics-url", "none",
                 "--tokenizer", str(tiny_checkpoint), "--levels", "1", "--request-count", "3",
                 "--out", str(tmp_path / "out"), "--quiet", "--no-plots"])
    assert code == EXIT_SLO_FAILED
    assert "SLO NOT met" in (tmp_path / "out" / "report.md").read_text()


def test_headless_locust_reports_ttft_and_no_failures(triton, tiny_checkpoint, tmp_path):
    from loadtest.locust_run import LocustOptions, run_locust

    result = run_locust(LocustOptions(url=triton.urls.grpc, users=2, spawn_rate=2, run_time_s=15, max_requests=8,
                                      prompt_tokens=16, max_tokens=8, tokenizer=tiny_checkpoint, out_dir=tmp_path))
    assert result.exit_code == EXIT_OK, result.text()
    assert result.failures == 0 and result.requests == 8
    assert result.timings["ttft_ms"]["count"] == 8 and result.timings["ttft_ms"]["p99"] > 0
    assert result.timings["tpot_ms"]["count"] > 0
    types = {row["Type"] for row in result.rows}
    assert {"gRPC", "TTFT", "TPOT"} <= types  # custom statistics next to the request latency
    assert result.row("gRPC", "generate")["Request Count"] == "8"
    assert (tmp_path / "locust_report.html").stat().st_size > 10_000


def test_diagnose_names_the_dominant_stage_of_a_slowed_configuration(test_profile, tmp_path):
    """Preprocessing's dynamic batcher is told to hold requests 250 ms for a batch of 8: at 1 stream every
    request waits there, which must come out as the dominant layer, with advice about that setting. The
    engine's split into wait + prefill and decode comes from the per-response gRPC send times in the trace."""
    from builders.profile import DynamicBatcher, Stage
    from builders.repository import render_repository
    from loadtest.diagnose import DiagnoseOptions, run_diagnose

    slow = test_profile.model_copy(update={"preprocessing": Stage(instances=1, batcher=DynamicBatcher(
        max_queue_delay_us=250_000, preferred_batch_sizes=[8], max_queue_size=64))})
    repo = render_repository(slow, tmp_path / "repo")
    d = run_diagnose(DiagnoseOptions(repository=repo, concurrency=1, requests=4, max_tokens=4, prompt_tokens=12,
                                     out_dir=tmp_path / "diag", server_ready_timeout_s=240))
    assert d.source.startswith("Triton trace")
    assert d.dominant_layer == "queue" and d.dominant_stage == "preprocessing queue"
    assert d.stages["preprocessing queue"] > 150
    assert "postprocessing" not in " ".join([*d.layers, *d.stages, *d.advice])
    # Engine times from the per-response gRPC sends. The random model's tokens are often partial UTF-8, which
    # the llm holds back until a character is complete, so 4 tokens come as 1-4 responses (+ the final one).
    per_request = json.loads((tmp_path / "diag" / "diagnose.json").read_text())["per_request"]
    assert per_request
    for s in per_request:
        assert 1 <= s["responses"] <= 5 and s["engine_prefill"] > 0
        assert (s["engine_decode"] > 0) == (s["responses"] > 1)
        assert s["engine_prefill"] + s["engine_decode"] + s["pre_queue"] < s["server_total"]
    assert "max_queue_delay_us=250000" in d.advice[0]
    text = (tmp_path / "diag" / "diagnose.md").read_text()
    assert "queue dominates" in text and "preprocessing queue" in text
    assert list((tmp_path / "diag" / "trace").glob("trace.json*"))


def test_report_serving_generates_the_document(smoke_run, triton, tiny_checkpoint, model_repository, tmp_path):
    """The benchmark document generator, in quick mode against the test server (no locust, no trace)."""
    doc = tmp_path / "serving.md"
    code = main(["report-serving", "--url", triton.urls.grpc, "--metrics-url", triton.urls.metrics,
                 "--http-url", triton.urls.http, "--tokenizer", str(tiny_checkpoint),
                 "--repository", str(model_repository), "--quick", "--levels", "1,2", "--no-locust",
                 "--doc", str(doc), "--out", str(tmp_path / "report")])
    assert code == EXIT_OK
    text = doc.read_text()
    assert "python -m loadtest report-serving" in text
    assert "| 1 |" in text and "| 2 |" in text
    assert "Triton overhead per request at 1 stream" in text and "perf_analyzer" in text
    assert "Where the time goes" in text  # diagnosis from perf_analyzer's breakdown (no trace file here)
    # the OpenAI front door, started by the report on a free port, side by side with direct gRPC
    assert "OpenAI front door vs direct gRPC" in text and "TTFT P50 at 1 stream" in text
    assert "locust, OpenAI HTTP/SSE user" in text and "**0 failures**" in text.split("locust, OpenAI")[1]
    bench = json.loads((tmp_path / "report" / "openai" / "openai-bench.json").read_text())
    assert bench["summary"]["throughput"]["errors"] == 0


@pytest.fixture(scope="module")
def front_door(triton):
    from tests.openai_front import FrontDoorProcess

    front = FrontDoorProcess(triton.urls.grpc)
    yield front
    assert front.stop() == 0


def test_locust_openai_sse_user_against_the_front_door(front_door, tiny_checkpoint, tmp_path):
    """The locust HTTP/SSE user (loadtest/locustfile_openai.py) on /v1/chat/completions: every request streamed
    to [DONE], TTFT from the first content chunk, TPOT from the usage chunk's token count."""
    from loadtest.locust_run import LocustOptions, run_locust

    result = run_locust(LocustOptions(url=front_door.url, openai="chat", users=2, spawn_rate=2, run_time_s=15,
                                      max_requests=6, prompt_tokens=12, max_tokens=8, tokenizer=tiny_checkpoint,
                                      out_dir=tmp_path))
    assert result.exit_code == EXIT_OK, result.text() + "\n" + result.log_tail
    assert result.failures == 0 and result.requests == 6
    assert result.timings["ttft_ms"]["count"] == 6 and result.timings["ttft_ms"]["p50"] > 0
    assert result.timings["latency_ms"]["p50"] >= result.timings["ttft_ms"]["p50"]
    assert {"HTTP", "TTFT"} <= {row["Type"] for row in result.rows}
    assert result.row("HTTP", "chat")["Request Count"] == "6"
    completions = run_locust(LocustOptions(url=front_door.url, openai="completions", users=1, run_time_s=10,
                                           max_requests=2, prompt_tokens=8, max_tokens=4,
                                           tokenizer=tiny_checkpoint, out_dir=tmp_path / "completions"))
    assert completions.exit_code == EXIT_OK and completions.requests == 2, completions.text()


def test_genai_perf_chat_profile_against_the_front_door(front_door, tiny_checkpoint, tmp_path):
    """genai-perf's --endpoint-type chat through `python -m loadtest genai-perf --profile openai-chat`."""
    from loadtest.tools import genai_perf_binary

    if genai_perf_binary() is None:
        pytest.skip("genai-perf not installed (python -m loadtest setup --genai-perf)")
    model = json.loads(__import__("urllib.request").request.urlopen(front_door.v1 + "/models").read())["data"][0]["id"]
    out = tmp_path / "gp"
    code = main(["genai-perf", "--profile", "openai-chat", "--url", front_door.url, "--model", model,
                 "--tokenizer", str(tiny_checkpoint), "--levels", "2", "--request-count", "4", "--num-prompts", "4",
                 "--out", str(out), "--quiet", "--no-plots"])
    summary = json.loads((out / "summary.json").read_text())
    assert code == EXIT_OK, summary["results"][0].get("error")
    r = summary["results"][0]
    assert r["ok"] and r["requests"] >= 4 and r["ttft"]["p50"] > 0 and r["throughput_rps"] > 0
