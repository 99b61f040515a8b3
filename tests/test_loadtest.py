"""loadtest without a server: profiles -> commands, input data, parsing, SLO exit codes, trace stages, metrics,
diagnosis rules and the autotuner's search (with a fake evaluator)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from loadtest import commands, metrics, slo
from loadtest import trace as tracing
from loadtest.diagnose import LAYERS, advise, layers_of
from loadtest.inputs import PromptTokenizer, generate_requests, perf_analyzer_data, prompt_with_tokens
from loadtest.results import LevelResult, Stats, parse_level
from loadtest.spec import (SLO, Inputs, Load, LoadProfile, Measurement, PromptMix, TokenDist, available_profiles,
                           load_profile)
from serving.prometheus import parse, scrape

REQUIRED_PROFILES = {"smoke", "concurrency", "poisson", "long-prompt", "streaming", "openai-chat",
                     "openai-completions"}
FIXTURES = Path(__file__).parent / "fixtures"
# `genai-perf profile --help` of the pinned genai-perf (0.0.16, build/tools/genai-perf), captured so the rendered
# command lines are checked against its real flags without the 1 GB tool installed.
GENAI_PERF_HELP = FIXTURES / "genai_perf_profile_help.txt"


# ---------------------------------------------------------------------------------------------- profiles


def test_every_profile_validates_and_the_required_ones_exist():
    names = set(available_profiles())
    assert REQUIRED_PROFILES <= names
    for name in names:
        p = load_profile(name)
        assert p.name == name
        if p.openai:  # the front door: the served model id, measured by genai-perf
            assert p.tool == "genai-perf" and p.model == "SmolLM2-135M-Instruct"
        else:
            assert p.model == "ensemble" and p.endpoint == "kserve"
    assert load_profile("openai-chat").endpoint == "chat"
    assert load_profile("openai-completions").endpoint == "completions"
    assert load_profile("poisson").load.mode == "request_rate"
    assert load_profile("poisson").load.distribution == "poisson"
    assert load_profile("concurrency").load.levels == [1, 4, 8, 16]
    assert load_profile("concurrency").slo.at == [8]


def test_bad_profiles_are_refused(tmp_path):
    with pytest.raises(ValueError):
        Load(mode="concurrency", levels=[1.5])
    with pytest.raises(ValueError):
        TokenDist(mean=10, min=20)
    with pytest.raises(ValueError):
        Inputs(prompt_tokens=TokenDist(mean=8))  # no output lengths
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nload: {levels: [1]}\ninputs: {prompt_tokens: {mean: 8}, output_tokens: {mean: 4}}\n"
                   "surprise: 1\n")
    with pytest.raises(ValueError):
        load_profile(bad)
    with pytest.raises(FileNotFoundError, match="available"):
        load_profile("no-such-profile")
    with pytest.raises(ValueError, match="genai-perf"):  # perf_analyzer 2.51 here speaks Triton's protocols only
        LoadProfile(name="x", endpoint="chat", load=Load(levels=[1]),
                    inputs=Inputs(prompt_tokens=TokenDist(mean=8), output_tokens=TokenDist(mean=4)))


# ---------------------------------------------------------------------------------------------- commands


def _args(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "" for i, a in
            enumerate(argv) if a.startswith("-")}


def test_concurrency_profile_to_perf_analyzer_command(tmp_path):
    p = load_profile("concurrency")
    argv = commands.perf_analyzer_args(p, 8, url="localhost:9001", input_data=tmp_path / "in.json",
                                       csv=Path("c8.csv"), export=tmp_path / "c8.json",
                                       metrics_url="http://localhost:9002/metrics")
    a = _args(argv)
    assert a["-m"] == "ensemble" and a["-i"] == "grpc" and a["-u"] == "localhost:9001"
    assert "--streaming" in argv  # decoupled ensemble: the stream API, always
    assert a["--concurrency-range"] == "8"
    assert a["--measurement-interval"] == "12000" and a["--max-trials"] == "3"
    assert a["--stability-percentage"] == "999"
    assert a["--input-data"] == str(tmp_path / "in.json")
    assert a["-f"] == "c8.csv" and "--verbose-csv" in argv and a["--profile-export-file"] == str(tmp_path / "c8.json")
    assert a["--metrics-url"] == "http://localhost:9002/metrics" and "--collect-metrics" in argv
    assert "--request-count" not in argv
    assert int(a["--max-threads"]) >= 8
    wide = commands.perf_analyzer_args(p, 32, url="u", input_data=Path("i"), csv=Path("c"), export=Path("e"))
    assert _args(wide)["--max-threads"] == "32"


def test_poisson_profile_and_request_counts():
    p = load_profile("poisson")
    argv = commands.perf_analyzer_args(p, 2.5, url="h:1", input_data=Path("i"), csv=Path("c"), export=Path("e"))
    a = _args(argv)
    assert a["--request-rate-range"] == "2.5" and a["--request-distribution"] == "poisson"
    assert "--concurrency-range" not in argv
    smoke = load_profile("smoke")
    assert commands.request_count(smoke, 1) == 6
    assert commands.request_count(smoke, 4) == 12  # 3 per stream
    assert _args(commands.perf_analyzer_args(smoke, 4, url="h:1", input_data=Path("i"), csv=Path("c"),
                                             export=Path("e")))["--request-count"] == "12"


def test_genai_perf_command_uses_a_local_tokenizer_and_min_tokens(tmp_path):
    p = load_profile("concurrency")
    argv = commands.genai_perf_args(p, 4, url="localhost:8001", tokenizer=tmp_path / "tok", artifact_dir=tmp_path / "a")
    a = _args(argv)
    assert argv[0] == "profile"
    assert a["--tokenizer"] == str(tmp_path / "tok")  # never the hub default
    assert a["--endpoint-type"] == "kserve" and a["--backend"] == "tensorrtllm"
    assert a["--synthetic-input-tokens-mean"] == "128" and a["--output-tokens-mean"] == "64"
    assert a["--extra-inputs"] == "min_tokens:64"  # our ensemble's name (genai-perf's flag sends min_length)
    assert "--output-tokens-mean-deterministic" not in argv
    assert "--streaming" in argv and a["--concurrency"] == "4"
    with pytest.raises(ValueError, match="mixes"):
        commands.genai_perf_args(load_profile("streaming"), 2, url="u", tokenizer=tmp_path, artifact_dir=tmp_path)


def _help_flags() -> tuple[set[str], dict[str, set[str]]]:
    """Every option genai-perf's profile --help lists, and the choices of the ones that have them."""
    import re

    text = GENAI_PERF_HELP.read_text()
    flags = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text))
    choices = {m.group(1): set(m.group(2).split(",")) for m in re.finditer(r"(--[\w-]+) \{([^}]+)\}", text)}
    return flags, choices


def _check_against_help(argv: list[str]) -> None:
    flags, choices = _help_flags()
    assert argv[0] == "profile"
    for i, a in enumerate(argv):
        if a.startswith("-"):
            assert a in flags, f"{a} is not a genai-perf profile flag"
            if a in choices:
                assert argv[i + 1] in choices[a], f"{a} {argv[i + 1]} not in {choices[a]}"


@pytest.mark.parametrize("name,endpoint", [("openai-chat", "chat"), ("openai-completions", "completions")])
def test_openai_profiles_render_genai_perf_commands_with_real_flags(name, endpoint, tmp_path):
    """genai-perf against the OpenAI front door: --endpoint-type chat|completions, the front door's host:port,
    the served model id, max_tokens only (min_tokens is not an OpenAI parameter: the front door would answer
    400), no Triton telemetry URL, and at least one warm-up request per stream (perf_analyzer 2.51 hangs
    otherwise)."""
    p = load_profile(name)
    argv = commands.genai_perf_args(p, 16, url="http://localhost:9000", tokenizer=tmp_path / "tok",
                                    artifact_dir=tmp_path / "a", metrics_url="http://localhost:8002/metrics")
    _check_against_help(argv)
    a = _args(argv)
    assert a["--endpoint-type"] == endpoint and a["-u"] == "localhost:9000"
    assert a["-m"] == "SmolLM2-135M-Instruct"
    assert "--backend" not in argv and "--extra-inputs" not in argv
    assert "--server-metrics-url" not in argv
    assert a["--tokenizer"] == str(tmp_path / "tok")
    assert a["--output-tokens-mean"] == "64" and a["--synthetic-input-tokens-mean"] == "128"
    assert "--streaming" in argv and a["--concurrency"] == "16"
    assert a["--warmup-request-count"] == "16"
    assert _args(commands.genai_perf_args(p, 1, url="h:1", tokenizer=tmp_path, artifact_dir=tmp_path))[
        "--warmup-request-count"] == "2"
    other = p.with_overrides(model="tiny", levels=[2])
    assert _args(commands.genai_perf_args(other, 2, url="h:1", tokenizer=tmp_path, artifact_dir=tmp_path))["-m"] == "tiny"


def test_triton_genai_perf_commands_use_real_flags(tmp_path):
    for name in ("concurrency", "smoke", "poisson"):
        p = load_profile(name)
        _check_against_help(commands.genai_perf_args(p, p.load.levels[-1], url="localhost:8001", tokenizer=tmp_path,
                                                     artifact_dir=tmp_path, metrics_url="http://localhost:8002/metrics"))


def test_genai_perf_help_fixture_matches_the_installed_tool():
    """When genai-perf is installed (python -m loadtest setup --genai-perf), the fixture is its real help."""
    import subprocess

    from loadtest.tools import genai_perf_binary

    binary = genai_perf_binary()
    if binary is None:
        pytest.skip("genai-perf not installed (python -m loadtest setup --genai-perf)")
    live = subprocess.run([str(binary), "profile", "--help"], capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    import re

    def flags(text: str) -> set[str]:
        return set(re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", text))

    assert flags(live.stdout) == flags(GENAI_PERF_HELP.read_text())


def test_genai_perf_summary_parses_into_a_level_result():
    from loadtest.results import parse_genai_perf_summary

    r = parse_genai_perf_summary(2, "concurrency", FIXTURES / "genai_perf_chat_summary.json")
    assert r.ok and r.requests == 4
    assert r.throughput_rps == pytest.approx(1.9468, rel=1e-3)
    assert r.ttft.p50 == pytest.approx(251.54, rel=1e-3) and r.tpot.p99 == pytest.approx(119.03, rel=1e-3)
    assert r.output_tokens_mean == 8 and r.prompt_tokens_mean == 16 and r.latency.max > r.latency.p50
    missing = parse_genai_perf_summary(2, "concurrency", FIXTURES / "none.json")
    assert not missing.ok and "missing" in missing.error


def test_openai_locust_command_and_bench_summary(tmp_path):
    from loadtest.locust_run import LOCUSTFILE_OPENAI, LocustOptions, locust_command
    from loadtest.openai_bench import _window_share, summarise, table

    argv = locust_command(LocustOptions(url="localhost:9000", openai="chat", model="m"), tmp_path)
    assert str(LOCUSTFILE_OPENAI) in argv and argv[argv.index("--host") + 1] == "http://localhost:9000"
    assert argv[argv.index("--route") + 1] == "chat" and argv[argv.index("--openai-model") + 1] == "m"
    assert _window_share(0, 10, 5, 20) == pytest.approx(0.5) and _window_share(3, 3, 0, 5) == 1.0
    result = {"ttft": {"chat": {"grpc_ttft_ms": {"p50": 50.0}, "http_ttft_ms": {"p50": 50.6},
                                "paired_diff_ms": {"p50": 0.5}, "overhead_p50_ms": 0.6}},
              "throughput": [{"path": "grpc", "tokens_per_s": 100.0, "requests_per_s": 3.0},
                             {"path": "http", "tokens_per_s": 94.0, "requests_per_s": 2.9}]}
    s = summarise(result)
    assert s["ttft"]["chat"]["met"] and s["throughput"]["ratio"] == pytest.approx(0.94)
    assert not s["throughput"]["met"]
    text = "\n".join(table(result, s, 16))
    assert "MISSED" in text and "0.940" in text


def test_cli_prints_commands_and_lists_profiles(capsys):
    from loadtest.__main__ import main

    assert main(["profiles"]) == 0
    assert "poisson" in capsys.readouterr().out
    assert main(["commands", "--profile", "concurrency", "--url", "localhost:9001", "--levels", "1,16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "--concurrency-range 16" in lines[1] and "--streaming" in lines[0]
    assert main(["sweep", "--profile", "no-such-profile"]) == slo.EXIT_ERROR
    # an OpenAI profile: genai-perf, the front door's default port unless --url says otherwise
    assert main(["commands", "--profile", "openai-chat", "--levels", "4", "--model", "x"]) == 0
    line = capsys.readouterr().out.strip()
    assert "genai-perf profile" in line and "--endpoint-type chat -u localhost:9000" in line and "-m x" in line


# ---------------------------------------------------------------------------------------------- inputs


def test_input_data_honours_token_lengths(tiny_checkpoint):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)  # what preprocessing counts
    tok = PromptTokenizer(tiny_checkpoint)
    spec = Inputs(prompt_tokens=TokenDist(mean=48, stddev=12, min=20, max=80),
                  output_tokens=TokenDist(mean=16, stddev=4, min=8, max=24), num_prompts=40, seed=7)
    requests = generate_requests(spec, tok)
    assert len(requests) == 40
    for r in requests:
        assert len(hf.encode(r.prompt)) == r.prompt_tokens
        assert 20 <= r.prompt_tokens <= 80 and 8 <= r.output_tokens <= 24
    assert len({r.prompt_tokens for r in requests}) > 5  # a distribution, not one value
    assert [r.prompt for r in generate_requests(spec, tok)] == [r.prompt for r in requests]  # seeded
    for n in (2, 5, 200):
        import random

        assert len(hf.encode(prompt_with_tokens(tok, n, random.Random(n)))) == n
    data = perf_analyzer_data(requests[:3], streaming=False)
    for entry, r in zip(data["data"], requests):
        assert entry["text_input"] == [r.prompt] and entry["max_tokens"] == [r.output_tokens]
        assert entry["min_tokens"] == [r.output_tokens] and entry["stream"] == [False]


def test_mixed_inputs_follow_the_weights(tiny_checkpoint):
    tok = PromptTokenizer(tiny_checkpoint)
    spec = Inputs(mix=[PromptMix(weight=3, prompt_tokens=TokenDist(mean=10), output_tokens=TokenDist(mean=4)),
                       PromptMix(weight=1, prompt_tokens=TokenDist(mean=60), output_tokens=TokenDist(mean=8))],
                  num_prompts=80, seed=1)
    requests = generate_requests(spec, tok)
    short = sum(r.prompt_tokens == 10 for r in requests)
    assert {r.prompt_tokens for r in requests} == {10, 60}
    assert 45 <= short <= 75


# ---------------------------------------------------------------------------------------------- parsing


def _export(path: Path, requests: list[tuple[int, list[int], list[int]]], bounds=None) -> None:
    """requests: (send ns, response ns list, cumulative num_output_tokens per response)."""
    exp = {"experiment": {"mode": "concurrency", "value": 2},
           "requests": [{"timestamp": t0, "request_inputs": {}, "response_timestamps": ts,
                         "response_outputs": [{"text_output": "x", "num_output_tokens": n, "num_input_tokens": 9}
                                              for n in ns]} for t0, ts, ns in requests],
           "window_boundaries": bounds or [0, 10**9]}
    path.write_text(json.dumps({"experiments": [exp], "version": "2.51.0", "service_kind": "triton"}))


def test_parse_level_computes_ttft_tpot_and_throughput(tmp_path):
    ms = 10**6
    # two requests: TTFT 10 ms and 20 ms; 5 tokens over 4 further responses 40 ms apart -> TPOT 10 ms
    _export(tmp_path / "e.json", [(0, [10 * ms, 20 * ms, 30 * ms, 40 * ms, 50 * ms], [1, 2, 3, 4, 5]),
                                  (100 * ms, [120 * ms, 200 * ms], [1, 9])])
    (tmp_path / "c.csv").write_text(
        "Concurrency,Inferences/Second,Response Throughput,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,"
        "p95 latency,p99 latency\n2,7.5,50,0,100,4,300,2000,500,0,60000,90000,95000,99000\n")
    (tmp_path / "llm_v1.c.csv").write_text(
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
        "Server Compute Infer,Server Compute Output,Client Recv\n2,7.5,0,1,150,50,600,5,0\n")
    r = parse_level(2, "concurrency", tmp_path / "c.csv", tmp_path / "e.json", fixed_count=True)
    assert r.ok and r.requests == 2
    assert r.ttft.p50 == pytest.approx(15.0) and r.ttft.max == pytest.approx(20.0)
    assert r.tpot.avg == pytest.approx((10.0 + 10.0) / 2)  # (50-10)/4 and (200-120)/8
    assert r.latency.max == pytest.approx(100.0)
    assert r.throughput_rps == pytest.approx(2 / 0.2)  # fixed count: requests / (last response - first send)
    assert r.pa_throughput_rps == 7.5
    assert r.output_tokens_mean == 7 and r.prompt_tokens_mean == 9
    assert r.server["compute_infer_us"] == 2000 and r.composing["llm"]["queue_us"] == 150
    assert r.pa_latency_p99_ms == 99.0
    # time windows: only requests sent inside the window count; throughput = completed in window / its length
    _export(tmp_path / "w.json", [(0, [10 * ms, 50 * ms], [1, 2]), (60 * ms, [70 * ms, 90 * ms], [1, 2]),
                                  (150 * ms, [160 * ms, 300 * ms], [1, 2])], bounds=[0, 100 * ms])
    with open(tmp_path / "w.json", "rb") as f, gzip.open(tmp_path / "w.json.gz", "wb") as g:
        g.write(f.read())
    w = parse_level(2, "concurrency", tmp_path / "none.csv", tmp_path / "w.json.gz")
    assert w.requests == 2 and w.throughput_rps == pytest.approx(2 / 0.1)


def test_a_level_without_output_is_a_failure(tmp_path):
    r = parse_level(1, "concurrency", tmp_path / "missing.csv", tmp_path / "missing.json")
    assert not r.ok and "no measurement" in r.error


# ---------------------------------------------------------------------------------------------- SLO


def _result(level, ttft_p99, tpot_p99=5.0, ok=True, rps=10.0) -> LevelResult:
    r = LevelResult(level=level, mode="concurrency", ok=ok, requests=10 if ok else 0, throughput_rps=rps)
    r.ttft = Stats(count=10, p50=ttft_p99 / 2, p99=ttft_p99)
    r.tpot = Stats(count=10, p50=tpot_p99 / 2, p99=tpot_p99)
    r.latency = Stats(count=10, p50=100, p99=200)
    if not ok:
        r.error = "perf_analyzer exit 99"
    return r


def test_slo_checks_and_exit_codes():
    s = SLO(at=[8], ttft_p99_ms=100, tpot_p99_ms=20)
    ok = [_result(1, 500), _result(8, 80)]  # level 1 misses TTFT but the SLO only applies at 8
    checks, missing = slo.check(s, ok)
    assert all(c.ok for c in checks) and not missing and slo.exit_code(checks, ok) == slo.EXIT_OK
    bad = [_result(1, 50), _result(8, 250, tpot_p99=25)]
    checks, _ = slo.check(s, bad)
    failed = {c.metric for c in checks if not c.ok}
    assert failed == {"ttft_p99_ms", "tpot_p99_ms"} and slo.exit_code(checks, bad) == slo.EXIT_SLO_FAILED
    assert "2.50x the limit" in slo.miss_ratio(next(c for c in checks if c.metric == "ttft_p99_ms"))
    broken = [_result(1, 50), _result(8, 0, ok=False)]
    checks, _ = slo.check(s, broken)
    assert slo.exit_code(checks, broken) == slo.EXIT_SLO_FAILED  # a failed level fails its SLO
    assert slo.exit_code([], [_result(1, 0, ok=False)]) == slo.EXIT_ERROR
    checks, missing = slo.check(s, [_result(1, 50)])
    assert missing == [8.0] and checks == []


def test_wait_for_server_fails_fast_with_a_clear_message():
    from loadtest.sweep import wait_for_server
    from loadtest.tools import ToolError
    from serving.launcher import free_port

    with pytest.raises(ToolError, match="no ready Triton server"):
        wait_for_server(f"localhost:{free_port()}", timeout_s=0.5)


# ---------------------------------------------------------------------------------------------- trace


def _span(i: int, model: str, parent: int | None, stamps: list[tuple[str, float]]) -> list[dict]:
    """One trace as Triton 2.51 writes it: a record naming the model, then one record per timestamp (ms here)."""
    recs = [{"id": i, "model_name": model, "model_version": 1, "request_id": "1",
             **({"parent_id": parent} if parent else {})}]
    return recs + [{"id": i, "timestamps": [{"name": k, "ns": int(v * 10**6)}]} for k, v in stamps]


def _stream_request(root: int, t0: float, sends: list[tuple[float, float]], children: bool = True) -> list[dict]:
    """An ensemble request over a gRPC stream, laid out as a real 2.51 trace of this stack: preprocessing and
    llm once each, written before the ensemble's own trace, which holds INFER_RESPONSE_COMPLETE once (first
    response) and a GRPC_SEND_START/GRPC_SEND_END pair per response. Times in ms after ``t0``."""
    recs = []
    if children:
        recs += _span(root + 2, "llm", root, [("REQUEST_START", t0 + 54), ("QUEUE_START", t0 + 54),
                                              ("COMPUTE_START", t0 + 54), ("COMPUTE_INPUT_END", t0 + 54.2),
                                              ("COMPUTE_OUTPUT_START", t0 + 54.9), ("COMPUTE_END", t0 + 55),
                                              ("REQUEST_END", t0 + 55)])
        recs += _span(root + 1, "preprocessing", root, [("REQUEST_START", t0 + 1), ("QUEUE_START", t0 + 1),
                                                        ("COMPUTE_START", t0 + 51), ("COMPUTE_INPUT_END", t0 + 51.5),
                                                        ("COMPUTE_OUTPUT_START", t0 + 52.5), ("COMPUTE_END", t0 + 53),
                                                        ("REQUEST_END", t0 + 53)])
    stamps = [("REQUEST_START", t0), ("QUEUE_START", t0 + 0.5), ("REQUEST_END", t0 + 200),
              ("GRPC_WAITREAD_START", t0 - 10), ("GRPC_WAITREAD_END", t0 - 0.1)]
    if sends:
        stamps.append(("INFER_RESPONSE_COMPLETE", t0 + sends[0][0]))
    for a, b in sends:
        stamps += [("GRPC_SEND_START", t0 + a), ("GRPC_SEND_END", t0 + b)]
    return recs + _span(root, "ensemble", None, stamps)


def test_trace_files_give_per_stage_times(tmp_path):
    base = tmp_path / "trace.json"
    first = _stream_request(1, 1000, [(75, 76), (125, 126), (196, 198)])  # prefill ends at 75, decode until 196
    failed = _stream_request(4, 2000, [], children=False)  # refused before the llm: nothing to attribute
    http = _stream_request(7, 3000, [])  # not a gRPC stream: no per-response times
    (tmp_path / "trace.json.0").write_text(json.dumps(first[:16]))  # a request's traces split over two files
    base.write_text(json.dumps(first[16:] + failed + http))
    files = tracing.trace_files(base)
    assert files == [tmp_path / "trace.json.0", base]
    stages = tracing.request_stages(tracing.load_spans(files))
    assert len(stages) == 1
    s = stages[0]
    assert s.server_total == pytest.approx(200) and s.ensemble_queue == pytest.approx(0.5)
    assert s.pre_queue == pytest.approx(50) and s.pre_compute == pytest.approx(2)
    assert s.llm_queue == pytest.approx(0) and s.llm_compute == pytest.approx(1)
    assert s.engine_prefill == pytest.approx(20)  # first response written - llm's execute() returned
    assert s.engine_decode == pytest.approx(121)  # last response written - first
    assert s.send_last == pytest.approx(2) and s.grpc_send_total == pytest.approx(4) and s.responses == 3
    assert s.other == pytest.approx(200 - 0.5 - 52 - 1 - 20 - 121 - 2)
    (tmp_path / "single.json").write_text(json.dumps(_stream_request(1, 5000, [(80, 81)])))
    single = tracing.request_stages(tracing.load_spans([tmp_path / "single.json"]))
    # stream=false: one response, so the whole generation counts as wait + prefill
    assert single[0].responses == 1 and single[0].engine_decode == 0
    assert single[0].engine_prefill == pytest.approx(25)
    mean = tracing.mean_stages(stages + single)
    assert mean["responses"] == pytest.approx(2) and mean["engine_decode"] == pytest.approx(60.5)


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics_deltas_with_and_without_the_engine_series():
    before = parse('nv_inference_request_success{model="llm",version="1"} 10\n'
                           'nv_inference_queue_duration_us{model="llm",version="1"} 1000\n'
                           'nv_inference_count{model="llm",version="1"} 10\n'
                           'nv_inference_exec_count{model="llm",version="1"} 10\n')
    after = parse('# HELP x\nnv_inference_request_success{model="llm",version="1"} 30\n'
                          'nv_inference_queue_duration_us{model="llm",version="1"} 5000\n'
                          'nv_inference_count{model="llm",version="1"} 30\n'
                          'nv_inference_exec_count{model="llm",version="1"} 20\n'
                          'nv_cpu_utilization 0.5\n')
    s = metrics.interval_summary(before, after)
    assert s["models"]["llm"]["avg_queue_duration_us"] == pytest.approx(200)
    assert s["models"]["llm"]["avg_batch_size"] == pytest.approx(2)
    assert "engine_histograms" not in s  # custom series absent: no error, no key
    hist = parse('llm_time_to_first_token_seconds_bucket{le="0.01"} 50\n'
                         'llm_time_to_first_token_seconds_bucket{le="0.1"} 90\n'
                         'llm_time_to_first_token_seconds_bucket{le="+Inf"} 100\n'
                         'llm_time_to_first_token_seconds_count 100\nllm_time_to_first_token_seconds_sum 3\n')
    h = metrics.interval_summary({}, hist)["engine_histograms"]["llm_time_to_first_token_seconds"]
    assert h["count"] == 100 and h["avg_ms"] == pytest.approx(30) and h["p50_ms"] == pytest.approx(10)
    assert scrape("http://localhost:1/metrics") == {}


# ---------------------------------------------------------------------------------------------- diagnosis


def test_advice_names_the_queue_and_its_batcher_delay():
    stages = {"client/network": 1.0, "ensemble queue": 0.0, "preprocessing queue": 300.0,
              "preprocessing compute": 2.0, "llm queue": 0.1, "llm enqueue (execute)": 0.5,
              "engine wait + prefill": 10.0, "engine decode": 40.0, "gRPC send (last response)": 0.2,
              "triton other (hand-offs)": 0.1}
    layers = layers_of(stages)
    assert list(layers) == list(LAYERS)  # every layer, each stage in exactly one of them
    assert sum(layers.values()) == pytest.approx(sum(stages.values()))
    assert max(layers, key=layers.get) == "queue"
    config = {"preprocessing": {"instances": 1, "max_queue_delay_us": 300000, "preferred_batch_sizes": [8]}}
    r = _result(2, 50)
    advice = advise(layers, stages, r, {}, config, {"max_batch_size": 8}, 2)
    assert "preprocessing queue" in advice[0] and "max_queue_delay_us=300000" in advice[0]
    stages.update({"preprocessing queue": 0.1, "engine decode": 400.0})
    advice = advise(layers_of(stages), stages, r, {"nv_cpu_utilization": {"mean": 0.2, "max": 0.3}}, config, {}, 1)
    assert "decoding dominates" in advice[0] and any("feeding path" in a for a in advice)
    stages.update({"engine decode": 4.0, "engine wait + prefill": 90.0})
    advice = advise(layers_of(stages), stages, r, {"llm_engine_queued_requests": {"mean": 3.0, "max": 5}}, config,
                    {"max_batch_size": 8}, 12)
    assert "KV-cache slot" in advice[0] and "8 slots" in advice[0]
    stages.update({"engine wait + prefill": 9.0, "gRPC send (last response)": 60.0})
    layers = layers_of(stages)
    assert max(layers, key=layers.get) == "triton (other)"
    assert "Triton's own time" in advise(layers, stages, r, {}, config, {}, 1)[0]


def test_layers_without_a_trace_leave_out_what_only_a_trace_measures():
    stages = {"ensemble queue": 0.1, "preprocessing queue": 0.2, "preprocessing compute": 3.0, "llm queue": 0.1,
              "llm enqueue (execute)": 0.4, "engine wait + prefill": 20.0, "engine decode": 80.0}
    layers = layers_of(stages)
    assert set(layers) == {"queue", "preprocessing", "engine: wait + prefill", "engine: decode"}
    assert layers["queue"] == pytest.approx(0.4) and layers["engine: wait + prefill"] == pytest.approx(20.4)


# ---------------------------------------------------------------------------------------------- autotuner


def test_tuner_picks_the_fastest_configuration_that_meets_the_slo(tmp_path, engine_dir, tiny_checkpoint):
    from loadtest.tune import TuneOptions, run_tune

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "name": "t", "engine_dir": str(engine_dir), "tokenizer_dir": str(tiny_checkpoint), "max_batch_size": 8,
        "preprocessing": {"instances": 1, "batcher": {"max_queue_delay_us": 0}}}))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"dimensions": {"preprocessing.instances": [1, 2, 4],
                                                    "preprocessing.batcher.max_queue_delay_us": [0, 500],
                                                    "engine.max_batch_size": [8, 16]}, "min_gain": 0.0},
                                    sort_keys=False))  # dimension order = search order
    profile = tmp_path / "load.yaml"
    profile.write_text(LoadProfile(name="tl", load=Load(levels=[2, 4]), inputs=Inputs(
        prompt_tokens=TokenDist(mean=8), output_tokens=TokenDist(mean=4)), measurement=Measurement(request_count=4),
        slo=SLO(latency_p99_ms=1000)).to_yaml())
    seen = []

    def fake(candidate, serving, work):
        """More preprocessing instances: faster; 4 instances: fastest but over the latency SLO."""
        seen.append((dict(candidate.settings), serving["preprocessing"]["instances"]))
        n = serving["preprocessing"]["instances"]
        out = []
        for level in (2, 4):
            r = _result(level, 10, rps=level * n)
            r.latency = Stats(count=4, p50=100, p99=2000 if n == 4 else 100 * level)
            out.append(r)
        return out

    outcome = run_tune(TuneOptions(profile=str(profile), space=space, base_profile=base, budget_s=60,
                                   max_candidates=10, out_dir=tmp_path / "out", progress=False), evaluate=fake)
    assert outcome.exit_code == 0
    assert outcome.chosen is not None and outcome.chosen.changed == {"preprocessing.instances": 2}
    assert outcome.chosen.score == 8 and outcome.chosen.best_level == 4
    assert seen[0][1] == 1  # the base first
    assert all(s[1] == 2 for s in seen[3:])  # the winner is kept while the other dimensions are tried
    chosen = yaml.safe_load((tmp_path / "out" / "chosen-profile.yaml").read_text())
    assert chosen["preprocessing"]["instances"] == 2
    from builders.profile import ServingProfile

    ServingProfile.model_validate(chosen)  # usable by `python -m builders repository`
    assert (tmp_path / "out" / "frontier.png").stat().st_size > 1000
    assert "**chosen**" in (tmp_path / "out" / "report.md").read_text()
    # a budget smaller than one candidate's cost stops after the base
    import time

    def slow(candidate, serving, work):
        time.sleep(0.05)
        return fake(candidate, serving, work)

    short = run_tune(TuneOptions(profile=str(profile), space=space, base_profile=base, budget_s=0.07,
                                 out_dir=tmp_path / "short", progress=False), evaluate=slow)
    assert len(short.candidates) == 1 and "budget" in short.stopped_because


def test_an_empty_profile_export_is_named_not_a_json_traceback(tmp_path):
    (tmp_path / "e.json").write_text("")
    r = parse_level(1, "concurrency", tmp_path / "missing.csv", tmp_path / "e.json")
    assert not r.ok and "e.json is empty or cut short" in r.error


def test_a_level_whose_export_came_back_empty_is_measured_again(tmp_path):
    """perf_analyzer once left its export empty after a successful run (CI, full suite's load): the level is
    measured a second time; the first attempt's log is kept beside the level's. Like the real perf_analyzer, the
    fake refuses an export path that already exists (CI caught a retry that left the empty file in place)."""
    from loadtest.sweep import run_level_pa
    from loadtest.tools import PerfAnalyzer

    ms = 10**6
    _export(tmp_path / "good.json", [(0, [10 * ms, 20 * ms], [1, 2])])
    calls = tmp_path / "calls"
    fake = tmp_path / "perf_analyzer"
    fake.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --profile-export-file ] && export_file="$2"; shift; done
echo run >> {calls}
if [ -e "$export_file" ]; then
  echo "Failed to parse --profile-export-file. Path must not already exist."; exit 99
fi
if [ "$(wc -l < {calls})" -eq 1 ]; then : > "$export_file"; else cp {tmp_path / "good.json"} "$export_file"; fi
""")
    fake.chmod(0o755)
    profile = load_profile("smoke").with_overrides(levels=[1.0])
    raw = tmp_path / "raw"
    raw.mkdir()
    result, _ = run_level_pa(profile, 1.0, pa=PerfAnalyzer(fake, tmp_path), url="localhost:1",
                             input_data=tmp_path / "inputs.json", raw=raw, metrics_url=None)
    assert calls.read_text().count("run") == 2
    assert result.ok and result.requests == 1, result.error
    assert "measuring again" in next(raw.glob("*.attempt1.log")).read_text()
    assert next(raw.glob("*.attempt1.profile_export.json")).stat().st_size == 0
