"""Issue 17's engine half: penalties, min_p, log-probs, n > 1 sequences and the grammar hook.

Formulas are checked against plain-Python references written here from their definitions (TensorRT-LLM's
penalty kernel, vLLM's min_p); log-probs against a teacher-forced fp32 Hugging Face forward of the same model.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from cpu_engine import FinishReason, GenerationRequest, SamplingParams
from cpu_engine.grammar import apply_bitmask, new_bitmask
from cpu_engine.sampling import Sampler, TokenCounts, apply_penalties, filtered_probs, sample
from tests.test_engine import EngineHold, start_engine

PROMPT = [0, 10, 20, 30, 10, 40]


class Collector:
    """Events per (request, sequence_index); a request is done when each of its sequences has ended."""

    def __init__(self):
        self.events = {}
        self.order = []  # every event, as it came
        self.lock = threading.Lock()

    def __call__(self, event):
        with self.lock:
            self.events.setdefault((event.request_id, event.sequence_index), []).append(event)
            self.order.append(event)

    def finished(self):
        with self.lock:
            return {key: evs[-1].finish_reason for key, evs in self.events.items() if evs[-1].finish_reason}

    def tokens(self, rid, index=0):
        return [e.token_id for e in self.events[(rid, index)] if e.token_id is not None]

    def wait(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while len(self.finished()) < n:
            assert time.monotonic() < deadline, f"only {len(self.finished())} of {n} sequences finished"
            time.sleep(0.01)


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint):
    return AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True, dtype=torch.float32).eval()


def hf_logprobs(model, ids):
    """Teacher-forced fp32 log-probs of every next token: [len(ids), V]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


def reference_penalised(logits, counts, temperature, rp, presence, frequency):
    """TensorRT-LLM's batchApplyPenalty for one row, one token at a time."""
    out = []
    for x, n in zip(logits, counts):
        x = x / temperature
        if n > 0:
            x = x * rp if x < 0 else x / rp
            x -= presence
            x -= frequency * n
        out.append(x)
    return out


# ---- formulas on fixed logits --------------------------------------------------------------------------------

def test_penalties_match_the_tensorrt_llm_kernel_row_by_row():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=gen) * 3
    counts = torch.randint(0, 4, (4, 50), generator=gen) * (torch.rand(4, 50, generator=gen) < 0.3)
    rp, presence, frequency = [1.3, 0.7, 1.0, 2.0], [0.0, 0.5, -0.4, 1.5], [0.2, 0.0, 0.3, -0.1]
    temperature = [1.0, 0.5, 2.0, 1.0]
    scaled = logits / torch.tensor(temperature)[:, None]
    rows, tokens = counts.nonzero(as_tuple=True)
    apply_penalties(scaled, rows, tokens, counts[rows, tokens], torch.tensor(rp), torch.tensor(presence),
                    torch.tensor(frequency))
    for b in range(4):
        expected = reference_penalised(logits[b].tolist(), counts[b].tolist(), temperature[b], rp[b], presence[b],
                                       frequency[b])
        assert scaled[b].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_temperature_comes_before_the_penalties():
    # Token 0 was seen. Temperature first: 2.0/2 - 0.08 = 0.92 < 0.95 → token 1; the other order would give
    # (2.0 - 0.08)/2 = 0.96 > 0.95 → token 0.
    counts = TokenCounts(1, 2)
    counts.start(0, [0])
    params = SamplingParams(top_k=1, temperature=2.0, presence_penalty=0.08)
    assert sample(torch.tensor([[2.0, 1.9]]), [Sampler(params)], [0], counts).tolist() == [1]


def reference_probs(logits, temperature, top_k, top_p, min_p):
    """softmax(logits / T) → top-k → min_p (p ≥ min_p · p_max, renormalised) → top-p (shortest prefix ≥ top_p)."""
    x = [v / temperature for v in logits]
    order = sorted(range(len(x)), key=lambda i: -x[i])
    keep = set(order[:top_k]) if 0 < top_k < len(x) else set(order)
    z = sum(math.exp(x[i]) for i in keep)
    p = [math.exp(x[i]) / z if i in keep else 0.0 for i in range(len(x))]
    if min_p > 0:
        floor = min_p * max(p)
        p = [v if v >= floor else 0.0 for v in p]
        p = [v / sum(p) for v in p]
    if top_p < 1:
        mass, out = 0.0, [0.0] * len(p)
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if mass >= top_p:
                break
            out[i], mass = p[i], mass + p[i]
        p = out
    return p


def test_top_k_min_p_top_p_match_their_definitions():
    # The last two: a flat distribution whose nucleus is nearly all of it, a peaked one whose nucleus is 1 token.
    settings = [(1.0, 0, 1.0, 0.0), (0.7, 10, 1.0, 0.1), (1.3, 0, 0.8, 0.05), (1.0, 5, 0.5, 0.0),
                (0.5, 0, 1.0, 0.3), (50.0, 0, 0.999, 0.0), (0.05, 0, 0.9, 0.0)]
    logits = torch.randn(len(settings), 40, generator=torch.Generator().manual_seed(1)) * 2
    temperature, top_k, top_p, min_p = (torch.tensor(col) for col in zip(*settings))
    probs = filtered_probs(logits / temperature[:, None], top_k, top_p, min_p)
    for b, (t, k, p, m) in enumerate(settings):
        expected = reference_probs(logits[b].tolist(), t, k, p, m)
        got = probs[b] / probs[b].sum()  # top-p leaves the kept mass unnormalised: the draw scales by the total
        assert got.tolist() == pytest.approx([v / sum(expected) for v in expected], abs=1e-6)


def test_bitmask_allows_exactly_the_set_bits():
    mask = new_bitmask(2, 70)
    assert mask.shape == (2, 3)
    mask[0] = 0
    mask[0, 33 // 32] |= 1 << (33 % 32)
    mask[0, 0] |= 1 << 31  # the sign bit is token 31
    logits = torch.zeros(2, 70)
    apply_bitmask(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [31, 33]
    assert torch.isfinite(logits[1]).all()


# ---- the engine ----------------------------------------------------------------------------------------------

def run(engine_dir, requests, **limits):
    collector = Collector()
    engine = start_engine(engine_dir, collector, **limits)
    for request in requests:
        engine.submit(request)
    collector.wait(sum(r.num_return_sequences for r in requests))
    engine.shutdown(10)
    return collector, engine


def test_greedy_penalties_match_a_teacher_forced_reference(engine_dir, hf_model):
    """Each emitted token is the argmax of the reference-penalised Hugging Face logits given prompt + output so far
    (TensorRT-LLM counts the prompt too)."""
    params = SamplingParams(top_k=1, temperature=0.8, repetition_penalty=1.8, presence_penalty=0.3,
                            frequency_penalty=0.2)
    collector, _ = run(engine_dir, [GenerationRequest("p", PROMPT, max_new_tokens=24, sampling=params),
                                    GenerationRequest("plain", PROMPT, max_new_tokens=24)])
    out = collector.tokens("p")
    assert out != collector.tokens("plain")
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT + out])).logits[0].double()
    for step, token in enumerate(out):
        ids = PROMPT + out[:step]
        counts = [ids.count(t) for t in range(logits.shape[-1])]
        ref = reference_penalised(logits[len(ids) - 1].tolist(), counts, 0.8, 1.8, 0.3, 0.2)
        assert token == max(range(len(ref)), key=ref.__getitem__), f"step {step}"


def test_seeds_reproduce_whatever_else_is_in_the_batch(engine_dir):
    mine = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=11, repetition_penalty=1.2,
                          frequency_penalty=0.3)
    alone, _ = run(engine_dir, [GenerationRequest("a", PROMPT, max_new_tokens=20, sampling=mine)])
    others = [GenerationRequest(f"o{i}", [0, i + 1, 2 * i + 3], max_new_tokens=10 + i,
                                sampling=SamplingParams(temperature=0.5 + 0.2 * i, top_k=i, seed=i,
                                                        presence_penalty=0.1 * i, min_p=0.02 * i))
              for i in range(5)]
    crowd, _ = run(engine_dir, [*others[:3], GenerationRequest("a", PROMPT, max_new_tokens=20, sampling=mine),
                                *others[3:]])
    assert crowd.tokens("a") == alone.tokens("a")


def count_prefill_tokens(engine):
    """Prompt tokens the model ran (blocks of more than one token per row), by a hook on the embedding."""
    seen = []
    engine.model.embed_tokens.register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].numel()) if args[0].shape[1] > 1 else None)
    return seen


@pytest.mark.parametrize("greedy", [True, False])
def test_n_sequences_prefill_once_and_free_every_slot(engine_dir, greedy):
    params = SamplingParams(top_k=1) if greedy else SamplingParams(temperature=1.0, top_k=0, seed=4)
    prompt = list(range(1, 21))  # 20 tokens: chunks of 16 + 4 under the 16-token step budget
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=4)
    prefilled = count_prefill_tokens(engine)
    engine.submit(GenerationRequest("n", prompt, max_new_tokens=12, sampling=params, num_return_sequences=4))
    collector.wait(4)
    assert sum(prefilled) == len(prompt)
    outputs = [collector.tokens("n", i) for i in range(4)]
    assert all(len(o) == 12 for o in outputs)
    if greedy:
        assert all(o == outputs[0] for o in outputs)
    else:
        assert len({tuple(o) for o in outputs}) == 4
        # Sequence i draws from seed + i: sequence 1 of seed 4 is sequence 0 of seed 5.
        engine.submit(GenerationRequest("seed5", prompt, max_new_tokens=12,
                                        sampling=SamplingParams(temperature=1.0, top_k=0, seed=5)))
        collector.wait(5)
        assert collector.tokens("seed5") == outputs[1]
    for i in range(4):
        last = collector.events[("n", i)][-1]
        assert last.finish_reason == FinishReason.LENGTH and last.num_output_tokens == 12
        assert last.num_input_tokens == len(prompt)
    assert engine.active == 0 and engine.slots.free == 4 and engine.kv_occupancy == 0
    engine.shutdown(10)


def test_n_sequences_wait_for_enough_slots_and_too_many_are_refused(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=2)
    with pytest.raises(ValueError, match="exceeds the engine's max_batch_size 2"):
        engine.submit(GenerationRequest("big", PROMPT, max_new_tokens=2, num_return_sequences=3))
    engine.submit(GenerationRequest("one", PROMPT, max_new_tokens=30))
    engine.submit(GenerationRequest("two", PROMPT, max_new_tokens=3, num_return_sequences=2))
    collector.wait(3)
    engine.shutdown(10)
    # "two" needs both slots, so none of its tokens comes before "one" has ended.
    rids = [e.request_id for e in collector.order]
    assert rids == ["one"] * 30 + ["two"] * 6


def test_cancellation_ends_all_n_and_frees_their_slots(engine_dir):
    collector = Collector()
    cancel = threading.Event()
    hold = EngineHold(collector, after=3)  # the first token of each of "run"'s 3 sequences
    engine = start_engine(engine_dir, hold, max_batch_size=4)
    engine.submit(GenerationRequest("run", PROMPT, max_new_tokens=200, num_return_sequences=3,
                                    is_cancelled=cancel.is_set))
    engine.submit(GenerationRequest("wait", PROMPT, max_new_tokens=200, num_return_sequences=2,
                                    is_cancelled=cancel.is_set))  # 3 + 2 > 4 slots: it waits
    hold.wait_holding()
    cancel.set()
    hold.release()
    collector.wait(5)
    assert collector.finished() == {(rid, i): FinishReason.CANCELLED for rid, n in (("run", 3), ("wait", 2))
                                    for i in range(n)}
    assert engine.active == 0 and engine.queued == 0 and engine.slots.free == 4 and engine.kv_occupancy == 0
    engine.shutdown(10)


@pytest.mark.parametrize("sampling", [SamplingParams(top_k=1),
                                      SamplingParams(temperature=0.7, top_k=0, seed=2, repetition_penalty=1.5)])
def test_log_probs_match_a_teacher_forced_forward(engine_dir, hf_model, sampling):
    """Log-probs are of the raw model distribution (before penalties and temperature), whatever the sampling."""
    collector, _ = run(engine_dir, [GenerationRequest("lp", PROMPT, max_new_tokens=16, sampling=sampling,
                                                      return_log_probs=True, top_logprobs=5),
                                    GenerationRequest("none", PROMPT, max_new_tokens=4)])
    events = [e for e in collector.events[("lp", 0)] if e.token_id is not None]
    out = [e.token_id for e in events]
    reference = hf_logprobs(hf_model, PROMPT + out)
    for step, event in enumerate(events):
        row = reference[len(PROMPT) + step - 1]
        assert event.logprob == pytest.approx(row[event.token_id].item(), abs=1e-3)
        ids = [t for t, _ in event.top_logprobs]
        values = [v for _, v in event.top_logprobs]
        assert len(ids) == 5 and values == sorted(values, reverse=True)
        assert values == pytest.approx(row[ids].tolist(), abs=1e-3)
        assert values[-1] >= row.topk(5).values[-1].item() - 1e-3
        if event.token_id in ids:
            assert values[ids.index(event.token_id)] == pytest.approx(event.logprob, abs=1e-6)
        if sampling.greedy:
            assert ids[0] == event.token_id
    assert all(e.logprob is None and e.top_logprobs == () for e in collector.events[("none", 0)])


class PathGuide:
    """A hand-written constraint: exactly ``path``, then the stop token (the request's end_id, else ``eos``)."""

    def __init__(self, path, eos):
        self.path, self.eos = path, eos

    def matcher(self, end_id=None):
        return PathMatcher(self.path, self.eos if end_id is None else end_id)


class PathMatcher:
    def __init__(self, path, end):
        self.path, self.end, self.pos, self.done = path, end, 0, False

    def _next(self):
        return self.path[self.pos] if self.pos < len(self.path) else self.end

    def fill(self, bitmask, row):
        bitmask[row] = 0
        token = self._next()
        bitmask[row, token // 32] = torch.tensor(1 << (token % 32)).to(torch.int32)

    def accept(self, token):
        if token != self._next():
            return False
        self.done = self.pos == len(self.path)
        self.pos += 1
        return True

    def finished(self):
        return self.done


def test_grammar_hook_constrains_each_sequence_and_wins_over_min_tokens(engine_dir):
    path, end = [7, 300, 7, 45, 0], 2
    requests = [
        GenerationRequest("g", PROMPT, max_new_tokens=20, guide=PathGuide(path, 99), end_id=end,
                          num_return_sequences=2, sampling=SamplingParams(temperature=1.0, top_k=0, seed=1,
                                                                          repetition_penalty=3.0)),
        # min_tokens asks for more than the grammar allows: the grammar's end wins.
        GenerationRequest("min", PROMPT, max_new_tokens=20, guide=PathGuide(path, 99), end_id=end,
                          sampling=SamplingParams(min_tokens=10)),
        # Without end_id, the guide's own stop token ends it, without being emitted.
        GenerationRequest("own", PROMPT, max_new_tokens=20, guide=PathGuide(path[:2], 99)),
        GenerationRequest("free", PROMPT, max_new_tokens=6),
    ]
    collector, _ = run(engine_dir, requests)
    done = collector.finished()
    for key in (("g", 0), ("g", 1), ("min", 0)):
        assert collector.tokens(*key) == path and done[key] == FinishReason.STOP
    assert collector.tokens("own") == path[:2] and done[("own", 0)] == FinishReason.STOP
    assert len(collector.tokens("free")) == 6 and collector.tokens("free")[:5] != path


@pytest.mark.parametrize("field, value, message", [
    ("num_return_sequences", 9, r"num_return_sequences must be in \[1, 8\]"),
    ("num_return_sequences", 0, r"num_return_sequences must be in"),
    ("top_logprobs", 21, r"top_logprobs must be in \[0, 20\]")])
def test_out_of_range_request_fields_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        GenerationRequest("r", PROMPT, max_new_tokens=4, **{field: value})


def test_the_serving_edge_and_the_engine_bound_a_request_alike():
    """The edge refuses with a message what the engine would refuse: the two limits must not drift apart."""
    from cpu_engine import scheduler
    from serving import request_params
    from serving.openai import protocol

    assert (request_params.MAX_SEQUENCES, request_params.MAX_TOP_LOGPROBS) == \
        (scheduler.MAX_SEQUENCES, scheduler.MAX_TOP_LOGPROBS) == (protocol.MAX_CHOICES, protocol.MAX_TOP_LOGPROBS)
