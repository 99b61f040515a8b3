"""The llama.cpp peer of the engine benchmark. Runs in the llama-cpp venv (build/tools/llama-cpp), not the project's.

Standalone on purpose (no project imports, no torch): it reads one JSON job on stdin and writes one JSON result
to the file named by its argument. Jobs:

* ``{"op": "quantize", "src": F32.gguf, "dst": Q8_0.gguf, "ftype": "q8_0", "threads": 2}`` — llama.cpp's own
  ``llama_model_quantize`` (what ``llama-quantize`` runs).
* ``{"op": "run", "gguf": path, "threads": 2, "n_ctx": 1024, "new_tokens": N, "warmup": 1,
  "requests": [{"ids": [...]}, ...], "tokenize": ["text", ...]}`` — greedy decoding of each request, one at a
  time (llama-cpp-python's ``Llama`` holds one sequence), the end-of-sequence token masked so every request
  gives exactly ``new_tokens`` tokens (the ``min_tokens`` semantics the other peers use). Prompts are token ids,
  so every peer sees the same prompt; ``tokenize`` texts come back tokenised by the GGUF's own tokenizer, to
  check its BPE metadata against Hugging Face's.
* ``{"op": "prefix", "gguf": path, "threads": 2, "n_ctx": 4096, "new_tokens": N, "cache_prompt": true,
  "requests": [{"ids": [...]}, ...]}`` — greedy decoding of each request in turn, as llama-server's one slot with
  ``cache_prompt``: the KV of the longest prefix the request shares with the slot's previous tokens is kept and
  only the rest is evaluated (``cache_prompt`` false: every prompt from scratch). Each result has its time to the
  first token.
* ``{"op": "logits", "gguf": path, "threads": 2, "ids": [...], "out": logits.npy, "tokenize": ["text", ...]}`` —
  teacher forcing: one forward pass over ``ids`` (no BOS added), the logits at every position saved as a float32
  ``(len(ids), n_vocab)`` array to ``out``; ``tokenize`` texts come back tokenised without BOS or special tokens
  (tests/test_model_source.py: the conversion proof).
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import numpy as np


def quantize(job: dict) -> dict:
    import llama_cpp

    ftypes = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
              "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftypes[job["ftype"]]
    params.nthread = int(job.get("threads", 2))
    start = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(job["src"].encode(), job["dst"].encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return {"seconds": time.perf_counter() - start}


def _load(job: dict, n_ctx: int):
    import llama_cpp

    threads = int(job.get("threads", 2))
    return llama_cpp.Llama(model_path=job["gguf"], n_ctx=int(job.get("n_ctx", n_ctx)), n_batch=512,
                           n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)


def _greedy_tokens(llm, new_tokens: int) -> tuple[list[int], list[float]]:
    """``new_tokens`` greedy tokens after the prompt already evaluated, end-of-sequence masked; each one's time."""
    import llama_cpp

    n_vocab, eos = llm.n_vocab(), llm.token_eos()
    out, times = [], []
    while True:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        masked = logits.copy()
        if 0 <= eos < n_vocab:
            masked[eos] = -np.inf
        out.append(int(np.argmax(masked)))
        times.append(time.perf_counter())
        if len(out) >= new_tokens:
            return out, times
        llm.eval([out[-1]])


def run(job: dict) -> dict:
    import llama_cpp

    start = time.perf_counter()
    llm = _load(job, 1024)
    load_s = time.perf_counter() - start
    new_tokens = int(job["new_tokens"])

    def greedy(ids: list[int]) -> dict:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        out, times = _greedy_tokens(llm, new_tokens)
        return {"tokens": out, "start": t0, "times": times}

    for _ in range(int(job.get("warmup", 1))):
        greedy(job["requests"][0]["ids"][:8])
    results = [greedy(r["ids"]) for r in job["requests"]]
    tokenized = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in job.get("tokenize", [])]
    return {"load_s": load_s, "results": results, "tokenized": tokenized, "rss_mb": _rss_mb(),
            "version": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode()}


def prefix(job: dict) -> dict:
    import llama_cpp

    llm = _load(job, 4096)
    previous: list[int] = []
    results = []
    for request in job["requests"]:
        ids = [int(i) for i in request["ids"]]
        t0 = time.perf_counter()
        keep = 0
        if job.get("cache_prompt", True):
            while keep < min(len(previous), len(ids) - 1) and previous[keep] == ids[keep]:
                keep += 1
        llm.n_tokens = keep  # eval() drops the KV cells past n_tokens before it appends
        llm.eval(ids[keep:])
        out, times = _greedy_tokens(llm, int(job["new_tokens"]))
        previous = ids + out[:-1]  # what the slot's KV holds now
        results.append({"tokens": out, "start": t0, "times": times, "reused": keep})
    return {"results": results, "rss_mb": _rss_mb(), "version": llama_cpp.__version__}


def _rss_mb() -> float:
    """This process's resident memory after the requests (the model is mmapped: its pages count once read)."""
    with open("/proc/self/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return round(kb / 1024, 1)


def logits(job: dict) -> dict:
    import llama_cpp

    ids, threads = [int(i) for i in job["ids"]], int(job.get("threads", 2))
    llm = llama_cpp.Llama(model_path=job["gguf"], n_ctx=max(512, len(ids)), n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False)
    start = time.perf_counter()
    llm.eval(ids)
    seconds = time.perf_counter() - start
    np.save(job["out"], np.asarray(llm.scores[: len(ids)], dtype=np.float32))
    tokenized = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in job.get("tokenize", [])]
    return {"seconds": seconds, "n_vocab": llm.n_vocab(), "tokenized": tokenized, "version": llama_cpp.__version__}


def main() -> None:
    job = json.loads(sys.stdin.read())
    result = {"quantize": quantize, "run": run, "prefix": prefix, "logits": logits}[job["op"]](job)
    # A file, not stdout: llama.cpp may print to stdout itself.
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
