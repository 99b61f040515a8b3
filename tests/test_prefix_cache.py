"""Prefix reuse and the paged KV cache in the engine: exact against Hugging Face, under pressure and preemption.

Hugging Face's greedy ``generate`` on the same checkpoint is the oracle; the engine runs with small blocks
(``tokens_per_block`` 8) so prompts span many blocks and end mid-block.
"""

from __future__ import annotations

import pytest
import torch

from cpu_engine import FinishReason, GenerationRequest, SamplingParams, native
from cpu_engine.quant import Int4Linear
from tests.test_engine import Collector, hf_model, start_engine  # noqa: F401 - the fixture

SYSTEM = list(range(40, 40 + 61))  # 61 tokens: 7 whole blocks of 8 and 5 more


def greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run(engine, collector, requests):
    for request in requests:
        engine.submit(request)
    collector.wait(len(collector.done) + len(requests))


def cached(collector, rid) -> int:
    return collector.events[rid][-1].cached_tokens


def test_a_shared_system_prompt_is_prefilled_once_and_answers_stay_exact(engine_dir, hf_model):
    _, model = hf_model
    collector = Collector()
    engine = start_engine(engine_dir, collector, tokens_per_block=8)
    run(engine, collector, [GenerationRequest("first", SYSTEM + [7], max_new_tokens=12)])
    assert cached(collector, "first") == 0
    # 16 at once after it: each takes the 7 whole blocks the first left, none of the partial one.
    prompts = {f"r{i}": SYSTEM + [200 + i, 300 + i] for i in range(16)}
    run(engine, collector, [GenerationRequest(rid, p, max_new_tokens=12) for rid, p in prompts.items()])
    stats = engine.prefix_cache
    engine.shutdown(10)
    assert collector.tokens("first") == greedy(model, SYSTEM + [7], 12)
    for rid, prompt in prompts.items():
        assert cached(collector, rid) == 56
        assert collector.tokens(rid) == greedy(model, prompt, 12), rid
    assert stats.hit_tokens == 16 * 56 and stats.missed_tokens == 62 + 16 * 7


def test_a_chat_turn_reuses_the_previous_turns_prompt_and_answer(engine_dir, hf_model):
    _, model = hf_model
    collector = Collector()
    engine = start_engine(engine_dir, collector, tokens_per_block=8)
    history, computed = SYSTEM[:20], 0
    for turn in range(4):
        history = history + [500 + turn, 501 + turn]
        run(engine, collector, [GenerationRequest(f"t{turn}", history, max_new_tokens=10)])
        answer = collector.tokens(f"t{turn}")
        assert answer == greedy(model, history, 10), turn
        # The whole blocks of the last turn are found again: its prompt and the answer it generated (all but the
        # answer's last token, which ended the request before it was fed back).
        assert cached(collector, f"t{turn}") == computed // 8 * 8
        history = history + answer
        computed = len(history) - 1
    engine.shutdown(10)


def test_cache_off_matches_cache_on_and_reports_nothing_cached(engine_dir):
    outputs = {}
    for reuse in (True, False):
        collector = Collector()
        engine = start_engine(engine_dir, collector, tokens_per_block=8, enable_kv_cache_reuse=reuse)
        run(engine, collector, [GenerationRequest("a", SYSTEM + [1], max_new_tokens=16)])
        run(engine, collector, [GenerationRequest("b", SYSTEM + [2], max_new_tokens=16,
                                                  sampling=SamplingParams(temperature=0.8, seed=3),
                                                  num_return_sequences=3)])
        engine.shutdown(10)
        outputs[reuse] = [collector.tokens(k) for k in ("a", "b")]
        assert cached(collector, "b") == (56 if reuse else 0)
    assert outputs[True] == outputs[False]


def test_a_pool_under_pressure_evicts_and_preempts_without_changing_a_token(engine_dir, hf_model):
    """A pool of 40 blocks (320 tokens) for 8 sequences growing to 130 tokens each: prefixes are evicted and
    sequences preempted and recomputed, and every answer still equals Hugging Face's."""
    _, model = hf_model
    collector = Collector()
    engine = start_engine(engine_dir, collector, tokens_per_block=8, max_tokens_in_paged_kv_cache=320)
    prompts = {f"p{i}": [(i * 37 + j) % 500 + 3 for j in range(30 + i)] for i in range(8)}
    run(engine, collector, [GenerationRequest(rid, p, max_new_tokens=100) for rid, p in prompts.items()])
    preemptions = engine.scheduler.preemptions
    stats = engine.blocks.stats()
    engine.shutdown(10)
    assert preemptions > 0
    for rid, prompt in prompts.items():
        assert collector.tokens(rid) == greedy(model, prompt, 100), rid
        assert collector.done[rid] == FinishReason.LENGTH
    assert stats.used == 0 and engine.kv_occupancy == 0


def test_a_cancelled_request_gives_its_blocks_back_and_keeps_its_prefix_cached(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector, tokens_per_block=8)
    cancel = {"now": False}
    engine.submit(GenerationRequest("c", SYSTEM + [9], max_new_tokens=150, is_cancelled=lambda: cancel["now"]))
    while len(collector.events.get("c", [])) < 3:
        pass
    cancel["now"] = True
    collector.wait(1)
    assert collector.done["c"] == FinishReason.CANCELLED
    run(engine, collector, [GenerationRequest("d", SYSTEM + [10], max_new_tokens=2)])
    stats = engine.blocks.stats()
    engine.shutdown(10)
    assert cached(collector, "d") == 56 and stats.used == 0


def test_a_prompt_gives_the_same_logits_cold_and_after_a_hit_whatever_it_left(int4_engine):
    """A hit leaves 1-8 tokens of the prompt (blocks of 8) where the cold prompt ran them in a 61-72-row step (or, past
    the 64-token budget, in a 1-8-token chunk too): the first token's log-probs must be the same. They were not while
    an option ran int4 prompt steps on bf16 GEMMs from 24 rows (the first-minute check's capital of France flipped
    between the two); every prompt step now runs ATen's int4 kernel whatever its rows, where decode steps may run the
    engine's own (quant.Int4Linear). Measured then on this tiny model: 1.0e-5-3.1e-5 apart; 1e-6 bounds what a
    library's choice of summation order by row count could change."""
    collector = Collector()
    engine = start_engine(int4_engine, collector, tokens_per_block=8, max_num_tokens=64)
    kernels = {m.dot for m in engine.model.modules() if isinstance(m, Int4Linear)}
    assert kernels == {native.int4_dot()}
    first = {}
    for extra in range(12):
        prompt = [40 + (i * 7 + extra * 13) % 400 for i in range(61 + extra)]  # a new prompt each time: cold
        for kind in ("cold", "hit"):
            run(engine, collector, [GenerationRequest(f"{kind}{extra}", prompt, max_new_tokens=1,
                                                      return_log_probs=True, top_logprobs=5)])
            first[kind, extra] = next(e for e in collector.events[f"{kind}{extra}"] if e.token_id is not None)
    engine.shutdown(10)
    for extra in range(12):
        cold, hit = first["cold", extra], first["hit", extra]
        assert (cold.cached_tokens, hit.cached_tokens) == (0, (60 + extra) // 8 * 8), extra
        assert hit.token_id == cold.token_id, extra
        assert [t for t, _ in hit.top_logprobs] == [t for t, _ in cold.top_logprobs], extra
        assert abs(hit.logprob - cold.logprob) <= 1e-6, (extra, hit.logprob - cold.logprob)


@pytest.mark.parametrize("budget, blocks", [(1024, 64), (10**6, 8 * 256 // 16), (100, 256 // 16 + 1)])
def test_the_pool_is_sized_by_its_budget_within_what_sequences_can_hold(engine_dir, budget, blocks):
    """The budget, capped at max_batch_size × max_seq_len (8 × 256 here) and never below one whole sequence plus
    a block to copy."""
    collector = Collector()
    engine = start_engine(engine_dir, collector, tokens_per_block=16, max_tokens_in_paged_kv_cache=budget)
    stats = engine.blocks.stats()
    engine.shutdown(10)
    assert stats.total == blocks and engine.cache.num_blocks == blocks + 1  # + the sink, besides the probe's reserve


@pytest.mark.parametrize("placement", ["adjacent", "two runs", "scattered"])
def test_a_decode_step_reads_the_same_keys_whatever_blocks_hold_them(engine_dir, placement):
    """model.Step reads one row's KV as one view (adjacent blocks), as views of runs (_attend_runs) or gathered:
    the logits of a decode step agree with those over adjacent blocks to float32 rounding."""
    from cpu_engine import load_engine
    from cpu_engine.kv_cache import KVCache

    loaded = load_engine(engine_dir)
    ids = list(range(5, 5 + 101))  # 100 prefilled + 1 decoded, over blocks of 8: 13 blocks
    tables = {"adjacent": list(range(1, 14)), "two runs": list(range(1, 8)) + list(range(20, 26)),
              "scattered": [30, 2, 17, 9, 25, 4, 12, 28, 6, 21, 14, 1, 33]}
    logits = {}
    with torch.inference_mode():
        for name in ("adjacent", placement):
            cache = KVCache(loaded.model.args, 40, 8, loaded.compute_dtype, probe_blocks=0)
            blocks = torch.tensor([tables[name]])
            loaded.model(torch.tensor([ids[:100]]), torch.arange(100)[None], blocks, cache)
            logits[name] = loaded.model(torch.tensor([[ids[100]]]), torch.tensor([[100]]), blocks, cache)
    torch.testing.assert_close(logits[placement], logits["adjacent"], rtol=1e-5, atol=1e-5)
