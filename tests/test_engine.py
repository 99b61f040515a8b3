"""The CPU engine in-process: in-flight batching keeps greedy results, sampling, stops, queue bound, variants."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from builders.cpu_build import BuildLimits, build_cpu_engine
from cpu_engine import (EngineLimits, FinishReason, GenerationRequest, LLMEngine, QueueFullError, SamplingParams,
                        load_engine)
from cpu_engine.kv_cache import KVCache
from serving.text import token_bytes_table

ROOT = Path(__file__).resolve().parents[1]


class Collector:
    def __init__(self):
        self.events = {}
        self.done = {}
        self.lock = threading.Lock()

    def __call__(self, event):
        with self.lock:
            self.events.setdefault(event.request_id, []).append(event)
            if event.finish_reason is not None:
                self.done[event.request_id] = event.finish_reason

    def tokens(self, rid):
        return [e.token_id for e in self.events[rid] if e.token_id is not None]

    def wait(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while len(self.done) < n:
            assert time.monotonic() < deadline, f"only {len(self.done)} of {n} requests finished"
            time.sleep(0.01)


class EngineHold:
    """An ``on_event`` wrapper that stops the engine thread inside its ``after``-th event until :meth:`release`:
    meanwhile every running request keeps its slot, so a test acts on requests that are surely still running
    (on 2 busy cores the tiny model's 200 tokens can otherwise end before the test thread runs again)."""

    def __init__(self, inner, after: int):
        self.inner, self.after = inner, after
        self.holding, self._released = threading.Event(), threading.Event()
        self._seen = 0

    def __call__(self, event):
        self.inner(event)
        self._seen += 1  # events come from the engine thread only
        if self._seen == self.after:
            self.holding.set()
            self._released.wait(60)

    def wait_holding(self, timeout: float = 60) -> None:
        assert self.holding.wait(timeout), f"the engine did not reach its event {self.after}"

    def release(self) -> None:
        self._released.set()


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True, dtype=torch.float32)
    return tokenizer, model.eval()


def start_engine(engine_dir, collector, token_bytes=None, **limits):
    loaded = load_engine(engine_dir)
    limits = {"max_queue_size": 64, "max_num_tokens": 16, **limits}  # a small token budget forces chunked prefill
    return LLMEngine(loaded.model, EngineLimits.from_build(loaded.build_config, **limits), collector,
                     token_bytes=token_bytes, dtype=loaded.compute_dtype).start()


def test_in_flight_batching_keeps_hugging_face_greedy_tokens(engine_dir, hf_model):
    tokenizer, model = hf_model
    prompts = ["def f(x):", "import os\nimport sys\nimport re\n\n\nclass Config:\n    '''Settings.'''\n",
               "x", "for i in range(10):\n    print(i)\n" * 3, "# comment", "a = {'k': [1, 2, 3]}\n" * 2,
               "while True:", "return None"]
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=4)
    ids = {}
    for i, prompt in enumerate(prompts):  # staggered arrivals: requests join a batch already running
        ids[str(i)] = tokenizer(prompt).input_ids
        engine.submit(GenerationRequest(str(i), ids[str(i)], max_new_tokens=20 + 3 * i))
        time.sleep(0.005 * (i % 3))
    collector.wait(len(prompts))
    engine.shutdown(10)
    for rid, prompt_ids in ids.items():
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt_ids]), max_new_tokens=20 + 3 * int(rid), do_sample=False,
                                 eos_token_id=None, pad_token_id=tokenizer.pad_token_id)[0, len(prompt_ids):]
        assert collector.tokens(rid) == ref.tolist(), f"prompt {rid} diverged from Hugging Face"
        assert collector.done[rid] == FinishReason.LENGTH


def test_seeds_reproduce_and_differ(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector)
    sampling = [SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=s) for s in (5, 5, 6)]
    for i, params in enumerate(sampling):
        engine.submit(GenerationRequest(str(i), [0, 10, 20, 30], max_new_tokens=24, sampling=params))
    collector.wait(3)
    engine.shutdown(10)
    assert collector.tokens("0") == collector.tokens("1")
    assert collector.tokens("0") != collector.tokens("2")


def test_end_id_min_tokens_and_stop_words(engine_dir, tiny_checkpoint, hf_model):
    tokenizer, _ = hf_model
    table = token_bytes_table(tiny_checkpoint)
    collector = Collector()
    engine = start_engine(engine_dir, collector, token_bytes=table)
    prompt = tokenizer("def main():").input_ids
    engine.submit(GenerationRequest("free", prompt, max_new_tokens=30))
    collector.wait(1)
    free = collector.tokens("free")
    first_new = next(k for k in range(3, len(free)) if free[k] not in free[:k])
    end_id = free[first_new]
    engine.submit(GenerationRequest("eos", prompt, max_new_tokens=30, end_id=end_id))
    engine.submit(GenerationRequest("min", prompt, max_new_tokens=30, end_id=end_id,
                                    sampling=SamplingParams(min_tokens=first_new + 2)))
    # A two-token stop word whose first occurrence in the free output ends at stop_end.
    stop_end = next(k + 2 for k in range(2, len(free) - 1)
                    if all(free[j:j + 2] != free[k:k + 2] for j in range(k)))
    engine.submit(GenerationRequest("stop", prompt, max_new_tokens=30, stop_words=[free[stop_end - 2:stop_end]]))
    # A stop string tokenised on its own differently than in the output (it starts inside a token).
    text = b"".join(table[t] for t in free).decode("utf-8", errors="ignore")
    stop_text = next(text[i:i + 3] for i in range(1, len(text) - 3) if text[i:i + 3].strip())
    stop_ids = tokenizer.encode(stop_text, add_special_tokens=False)
    engine.submit(GenerationRequest("text", prompt, max_new_tokens=30, stop_words=[stop_ids]))
    collector.wait(5)
    engine.shutdown(10)
    assert collector.tokens("eos") == free[:first_new] and collector.done["eos"] == FinishReason.STOP
    assert len(collector.tokens("min")) >= first_new + 2
    assert collector.tokens("stop") == free[:stop_end] and collector.done["stop"] == FinishReason.STOP
    out = b"".join(table[t] for t in collector.tokens("text")).decode("utf-8", errors="ignore")
    assert collector.done["text"] == FinishReason.STOP and stop_text in out
    assert len(collector.tokens("text")) < len(free)


def test_bad_words_are_never_generated(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector)
    engine.submit(GenerationRequest("free", [0, 7, 8, 9], max_new_tokens=16))
    collector.wait(1)
    banned = sorted(set(collector.tokens("free")))[:3]
    engine.submit(GenerationRequest("banned", [0, 7, 8, 9], max_new_tokens=16, bad_words=[[t] for t in banned]))
    collector.wait(2)
    engine.shutdown(10)
    assert not set(collector.tokens("banned")) & set(banned)


def test_cancellation_frees_the_slot_and_full_queue_rejects(engine_dir):
    collector = Collector()
    cancelled = threading.Event()
    hold = EngineHold(collector, after=1)
    engine = start_engine(engine_dir, hold, max_batch_size=1, max_queue_size=2)
    engine.submit(GenerationRequest("long", [0, 1, 2], max_new_tokens=200, is_cancelled=cancelled.is_set))
    hold.wait_holding()  # "long" holds the only slot; the next two wait in the queue
    engine.submit(GenerationRequest("q1", [0, 1, 2], max_new_tokens=4))
    engine.submit(GenerationRequest("q2", [0, 1, 2], max_new_tokens=4))
    with pytest.raises(QueueFullError, match="queue is full"):
        engine.submit(GenerationRequest("q3", [0, 1, 2], max_new_tokens=4))
    cancelled.set()
    hold.release()
    collector.wait(3)
    assert collector.done["long"] == FinishReason.CANCELLED
    assert len(collector.tokens("long")) < 200
    assert engine.active == 0 and engine.queued == 0 and engine.kv_occupancy == 0
    engine.shutdown(10)


def test_shutdown_drains_accepted_requests(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=2)
    for i in range(5):
        engine.submit(GenerationRequest(str(i), [0, 3, 4], max_new_tokens=12))
    engine.shutdown(timeout=30)
    assert set(collector.done) == {str(i) for i in range(5)}
    assert all(len(collector.tokens(str(i))) == 12 for i in range(5))
    with pytest.raises(QueueFullError, match="shutting down"):
        engine.submit(GenerationRequest("late", [0, 1], max_new_tokens=2))


# Top-1 agreement with the fp32 engine on held-out text; thresholds sit below what the tiny random
# test model reaches (its logits are nearly flat, the hardest case for quantisation).
AGREEMENT = {"bf16": 0.95, "int8_wo": 0.9, "int8_sq": 0.85, "int4_awq": 0.7, "fp8": 0.85}


def _logits(engine_dir, ids):
    loaded = load_engine(engine_dir)
    cache, blocks = KVCache.for_one_sequence(loaded.model.args, len(ids), loaded.compute_dtype)
    with torch.inference_mode():
        return loaded.model(torch.tensor([ids]), torch.arange(len(ids))[None], blocks, cache, last_only=False)[0]


@pytest.mark.parametrize("variant", sorted(AGREEMENT))
def test_quantised_variant_agrees_with_full_precision(variant, tiny_checkpoint, engine_dir, tmp_path, hf_model):
    from builders.english_text import evaluation_texts, token_stream

    tokenizer, _ = hf_model
    ids = token_stream(tokenizer, evaluation_texts()[:8])[:192]
    out = build_cpu_engine(tiny_checkpoint, tmp_path / variant, variant=variant,
                           limits=BuildLimits(max_batch_size=2, max_input_len=192, max_seq_len=256,
                                              max_num_tokens=64), calib_samples=8)
    reference, quantised = _logits(engine_dir, ids), _logits(out, ids)
    agreement = (reference.argmax(-1) == quantised.argmax(-1)).float().mean().item()
    assert agreement >= AGREEMENT[variant], f"{variant}: top-1 agreement {agreement:.3f}"


def test_eval_command_reports_every_variant(tiny_checkpoint, tmp_path):
    from builders.evaluate import evaluate, to_markdown

    results = evaluate(tiny_checkpoint, tmp_path, variants=("fp32", "int8_wo"), seq_len=64, max_windows=2,
                       calib_samples=4)
    assert [r.variant for r in results] == ["fp32", "int8_wo"]
    fp32, int8 = results
    assert fp32.top1_agreement == 1.0 and fp32.mean_kl == 0.0 and fp32.perplexity > 1
    assert int8.quant_algo == "W8A16" and int8.weight_bytes < fp32.weight_bytes and int8.mean_kl > 0
    assert "| int8_wo | W8A16 |" in to_markdown(results, "cmd", 2, 64)


def test_chat_target_counts_answers_that_start_like_fp32():
    """docs/evaluation.md's chat target: an answer counts when its first CHAT_PREFIX_TOKENS tokens are fp32's."""
    from builders.evaluate import CHAT_PREFIX_TOKENS, chat_agreement

    reference = [[1] * 12, [2] * 12]
    late = [1] * CHAT_PREFIX_TOKENS + [9, 9]  # leaves fp32 after the prefix: counts
    early = [2, 9] + [2] * 10  # leaves it inside the prefix: does not
    assert chat_agreement([late, early], reference) == 0.5
    assert chat_agreement([], []) is None


def test_builder_cli_offers_every_cpu_variant(tiny_checkpoint, tmp_path, capsys):
    """`python -m builders engine --variant` takes exactly cpu_build.VARIANTS (it once refused int4_awq)."""
    from builders.__main__ import main
    from builders.cpu_build import VARIANTS
    from cpu_engine.engine_dir import read_config

    def exit_code(variant: str) -> int:
        # argparse checks --variant's choice before it reaches --help: 2 for a refused value, 0 otherwise.
        with pytest.raises(SystemExit) as exited:
            main(["engine", "--checkpoint", "c", "--output", "o", "--variant", variant, "--help"])
        return exited.value.code

    assert {v: exit_code(v) for v in (*VARIANTS, "int3")} == {**dict.fromkeys(VARIANTS, 0), "int3": 2}
    capsys.readouterr()
    out = tmp_path / "int4_awq"
    main(["engine", "--checkpoint", str(tiny_checkpoint), "--output", str(out), "--variant", "int4_awq",
          "--calib-samples", "4"])
    assert read_config(out)["pretrained_config"]["quantization"]["quant_algo"] == "W4A16_AWQ"


def test_the_caller_thread_runs_no_openmp_work(engine_dir):
    """Loading and constructing the engine leave no OpenMP pool on the caller's thread (cpu_engine/threads.py): with
    one there, libgomp stops letting the engine thread's workers spin, and int8 decode ran at ~60 % speed (a KV-sized
    zero fill on the caller's thread did that: 95-102 → 56-61 tok/s batch-1 on the real model). Checked in a fresh
    process by its OS threads, which an OpenMP pool adds and keeps: none may appear before the engine thread runs.
    256 slots: the per-slot tables are then large enough for torch to split their fill over threads."""
    code = f"""
import os, time, torch
torch.set_num_threads(2)
from cpu_engine import EngineLimits, LLMEngine, load_engine
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
loaded = load_engine({str(engine_dir)!r})
engine = LLMEngine(loaded.model, EngineLimits(max_batch_size=256, max_seq_len=256, max_num_tokens=64,
                   max_queue_size=8), on_event=lambda e: None, dtype=loaded.compute_dtype)
# The scratch threads' pools exit with them, a moment after join(); a pool on this thread stays for good.
deadline = time.monotonic() + 5
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, threads())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split()[-2:])
    assert after == before, f"{after - before} thread(s) left by load_engine + LLMEngine() on the caller's thread"
