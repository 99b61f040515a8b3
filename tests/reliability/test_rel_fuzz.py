"""Section 6 — property-based fuzzing (hypothesis) of text handling, stop words and request parsing.

10,000 generated cases in total (the ``max_examples`` below add up to it), 0 crashes allowed:

* tokenise → token bytes → text is the identity for any Unicode text (serving/text.py's byte table);
* the streaming chunker's chunks, decoded one by one, concatenate to the whole decode, for any id sequence
  (including ids that are invalid UTF-8 on their own, special tokens and out-of-range ids);
* TensorRT-LLM word lists round-trip, and malformed ones fail only with ValueError;
* the engine's byte-level stop-word matcher stops at exactly the first occurrence, across token boundaries;
* sampling / length validation (serving/request_params.py) accepts exactly the valid values, else ValueError;
* the preprocessing model's request parsing, fed arbitrary tensors, answers INVALID_ARG or valid tensors and
  never raises (with a stand-in for triton_python_backend_utils).

Pinned: hypothesis==6.170.15. Deterministic: derandomize=True, no example database.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import math
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="pip install hypothesis==6.170.15 (dev dependency)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from serving.request_params import GREEDY, check_lengths, check_min_tokens, resolve_sampling  # noqa: E402
from serving.text import Utf8Chunker, decode_ids, from_word_list, to_word_list, token_bytes_table  # noqa: E402

BUDGET = {"round_trip": 2000, "chunker": 2000, "word_list": 1000, "word_list_garbage": 1000, "stop_words": 1000,
          "sampling": 1500, "lengths": 500, "preprocessing": 1000}
assert sum(BUDGET.values()) == 10_000


def fuzz(name: str):
    return settings(max_examples=BUDGET[name], derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# Any Unicode scalar value (surrogates are not text and cannot be UTF-8 encoded), now and then with the
# tokenizer's special-token strings inside (a prompt about HTML or about tokenizers contains "</s>").
SPECIALS = ["<s>", "</s>", "<pad>"]
TEXT = st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
                          st.sampled_from(SPECIALS)), max_size=4).map("".join)


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)


@pytest.fixture(scope="module")
def table(tiny_checkpoint):
    return token_bytes_table(tiny_checkpoint)


def test_the_budget_is_ten_thousand_cases():
    assert sum(BUDGET.values()) == 10_000


@fuzz("round_trip")
@given(text=TEXT)
def test_tokenise_then_decode_bytes_is_the_identity(tok, table, text):
    """With split_special_tokens=True user text stays text; see test_prompt_text_is_never_a_control_token."""
    ids = tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert decode_ids(table, ids) == text
    assert b"".join(table[i] for i in ids) == text.encode("utf-8")


@fuzz("chunker")
@given(data=st.data())
def test_streamed_chunks_concatenate_to_the_whole_text(table, data):
    ids = data.draw(st.lists(st.one_of(st.integers(0, len(table) - 1), st.integers(-3, len(table) + 3)),
                             max_size=60))
    chunker = Utf8Chunker(table)
    chunks = [c for c in (chunker.push(i) for i in ids) if c is not None] + [chunker.flush()]
    assert [i for c in chunks for i in c] == ids  # nothing lost, nothing reordered
    whole = decode_ids(table, ids)
    assert "".join(decode_ids(table, c) for c in chunks) == whole
    for chunk in chunks[:-1]:  # every chunk but the last ends on a character boundary
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoder.decode(b"".join(table[i] for i in chunk if 0 <= i < len(table)))
        assert decoder.getstate()[0] == b""


@fuzz("word_list")
@given(words=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6), max_size=8))
def test_word_lists_round_trip(words):
    packed = to_word_list(words)
    assert packed.dtype == np.int32 and packed.shape[0] == 2
    assert from_word_list(packed) == words


@fuzz("word_list_garbage")
@given(flat=st.lists(st.integers(-2**31, 2**31 - 1), max_size=8), offsets=st.lists(st.integers(-3, 12), max_size=8))
def test_malformed_word_lists_fail_only_with_value_error(flat, offsets):
    width = max(len(flat), len(offsets), 1)
    arr = np.full((2, width), -1, dtype=np.int32)
    arr[0, :len(flat)] = flat
    arr[1, :len(offsets)] = offsets
    try:
        words = from_word_list(arr)
    except ValueError as exc:
        assert "malformed word list" in str(exc)
        return
    assert all(w for w in words) and sum(map(len, words)) <= width


@fuzz("stop_words")
@given(data=st.data())
def test_stop_words_match_on_bytes_at_the_first_occurrence(table, data):
    """cpu_engine's matcher (token_rules.hits_stop_word over cpu_engine/stop_strings.py), driven token by token like
    the engine does."""
    from cpu_engine.stop_strings import StopStrings
    from cpu_engine.token_rules import hits_stop_word

    printable = [i for i, b in enumerate(table) if b]
    stream = data.draw(st.lists(st.sampled_from(printable), min_size=1, max_size=40))
    text = b"".join(table[i] for i in stream)
    picks = data.draw(st.lists(st.tuples(st.integers(0, len(text) - 1), st.integers(1, 6)), min_size=1,
                               max_size=3))
    stops = [text[a:a + n] for a, n in picks] + data.draw(st.lists(st.binary(min_size=1, max_size=4), max_size=2))
    seq = SimpleNamespace(request=SimpleNamespace(stop_words=[[0]] * len(stops)), stops=StopStrings(stops),
                          output_ids=[])
    hit_at = None
    for n, token in enumerate(stream, start=1):
        seq.output_ids.append(token)
        if hits_stop_word(seq, token, table):
            hit_at = n
            break
    ends = [len(b"".join(table[i] for i in stream[:n])) for n in range(1, len(stream) + 1)]
    first = next((n for n, end in enumerate(ends, start=1) if any(s in text[:end] for s in stops)), None)
    assert hit_at == first


FLOATS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))


@fuzz("sampling")
@given(temperature=FLOATS, top_k=st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)), top_p=FLOATS)
def test_sampling_validation_accepts_exactly_the_valid_values(temperature, top_k, top_p):
    valid = ((temperature is None or (math.isfinite(temperature) and temperature >= 0))
             and (top_k is None or top_k >= 0)
             and (top_p is None or (not math.isnan(top_p) and 0 < top_p <= 1)))
    try:
        s = resolve_sampling(temperature, top_k, top_p)
    except ValueError as exc:
        assert not valid and "must be" in str(exc)
        return
    assert valid
    assert math.isfinite(s.temperature) and s.temperature >= 0 and s.top_k >= 0 and 0 < s.top_p <= 1
    if (temperature, top_k, top_p) == (None, None, None) or temperature == 0:
        assert s == GREEDY


@fuzz("lengths")
@given(input_len=st.integers(-5, 400), max_tokens=st.integers(-2**31, 2**31 - 1), min_tokens=st.integers(-10, 300))
def test_length_validation(input_len, max_tokens, min_tokens):
    ok = input_len <= 192 and 1 <= max_tokens <= 256 - input_len
    try:
        check_lengths(input_len, max_tokens, 192, 256)
        assert ok
    except ValueError as exc:
        assert not ok and ("max_tokens must be between" in str(exc) or "accepts at most 192" in str(exc))
    try:
        check_min_tokens(min_tokens, max_tokens)
        assert 0 <= min_tokens <= max_tokens
    except ValueError as exc:
        assert "min_tokens must be between 0 and max_tokens" in str(exc)


# ---- the preprocessing model's execute(), outside Triton


class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _Error:
    INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

    def __init__(self, message, code=None):
        self._message, self.code = message, code

    def message(self):
        return self._message


class _Response:
    def __init__(self, output_tensors, error=None):
        self.output_tensors, self.error = output_tensors, error


def fake_pb_utils():
    """Just what model_repository/preprocessing/1/model.py and serving/triton_io.py use."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor
    pb.TritonError = _Error
    pb.InferenceResponse = _Response
    pb.get_input_tensor_by_name = lambda request, name: (_Tensor(name, request[name]) if name in request else None)
    pb.Logger = types.SimpleNamespace(log_info=lambda message: None)
    return pb


@pytest.fixture(scope="module")
def token_table(tiny_checkpoint) -> list[bytes]:
    """Each token id's bytes, read from tokenizer.json by the serving code's own reader."""
    return token_bytes_table(tiny_checkpoint)


@pytest.fixture(scope="module")
def preprocessing(tiny_checkpoint):
    from serving.launcher import PROJECT_ROOT

    saved = {k: sys.modules.get(k) for k in ("triton_python_backend_utils", "serving.triton_io")}
    sys.modules["triton_python_backend_utils"] = fake_pb_utils()
    sys.modules.pop("serving.triton_io", None)
    try:
        spec = importlib.util.spec_from_file_location("rel_preprocessing_model",
                                                      PROJECT_ROOT / "model_repository/preprocessing/1/model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.TritonPythonModel()
        params = {"tokenizer_dir": str(tiny_checkpoint), "max_input_len": "192", "max_seq_len": "256", "vocab_size": "512"}
        config = json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})
        model.initialize({"model_name": "preprocessing", "model_config": config})
        yield model
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def batch(value, dtype, rows=1):
    return np.array([[value]] * rows, dtype=dtype)


OPTIONAL = {  # ensemble input -> strategy of values, numpy dtype (as Triton would deliver them)
    "temperature": (FLOATS.filter(lambda v: v is not None), np.float32),
    "top_k": (st.integers(-2**31, 2**31 - 1), np.int32),
    "top_p": (FLOATS.filter(lambda v: v is not None), np.float32),
    "seed": (st.integers(0, 2**64 - 1), np.uint64),
    "min_tokens": (st.integers(-2**31, 2**31 - 1), np.int32),
    "end_id": (st.integers(-2**31, 2**31 - 1), np.int32),
    "pad_id": (st.integers(-2**31, 2**31 - 1), np.int32),
    "stream": (st.booleans(), bool),
    "exclude_input_in_output": (st.booleans(), bool),
}


@fuzz("preprocessing")
@given(data=st.data())
def test_preprocessing_parses_any_request_without_crashing(preprocessing, token_table, data):
    text = data.draw(st.one_of(TEXT.map(lambda t: t.encode()), st.binary(max_size=40)))
    request = {"text_input": batch(text, object, rows=data.draw(st.sampled_from([1, 1, 1, 2]))),
               "max_tokens": batch(data.draw(st.integers(-2**31, 2**31 - 1)), np.int32)}
    for name in data.draw(st.sets(st.sampled_from(sorted(OPTIONAL)), max_size=4)):
        strategy, dtype = OPTIONAL[name]
        request[name] = batch(data.draw(strategy), dtype)
    for name in data.draw(st.sets(st.sampled_from(["stop_words", "bad_words"]), max_size=2)):
        words = data.draw(st.lists(st.one_of(TEXT.map(lambda t: t.encode()), st.binary(max_size=6)), max_size=3))
        request[name] = np.array([words or [b""]], dtype=object)
    (response,) = preprocessing.execute([request])  # must not raise
    if response.error is not None:
        assert response.error.code == _Error.INVALID_ARG and response.error.message()
        return
    out = {t.name(): t.as_numpy() for t in response.output_tensors}
    ids = out["input_ids"][0]
    assert b"".join(token_table[i] for i in ids) == text  # the prompt, byte for byte
    assert 1 <= ids.size <= 192 and out["input_lengths"][0, 0] == ids.size
    assert 1 <= out["request_output_len"][0, 0] <= 256 - ids.size
    assert out["stop_words_list"].shape[:2] == (1, 2) and out["bad_words_list"].shape[:2] == (1, 2)
    assert 0 < out["runtime_top_p"][0, 0] <= 1 and out["runtime_top_k"][0, 0] >= 0


@pytest.mark.parametrize("prompt", ["<|im_end|>", 'print("<|im_end|>")', "<|im_start|>def f():",
                                    "x = '<|endoftext|>'"])
def test_prompt_text_is_never_a_control_token(preprocessing, token_table, prompt):
    """A prompt containing the text "<|im_end|>" must reach the model as that text, not as the end-of-turn token
    (which ends the context mid-prompt and drops the text from echoes: `print("</s>")` came back as `print("")`
    with the old default model)."""
    (response,) = preprocessing.execute([{"text_input": batch(prompt.encode(), object),
                                          "max_tokens": batch(4, np.int32)}])
    assert response.error is None
    ids = next(t.as_numpy() for t in response.output_tensors if t.name() == "input_ids")[0].tolist()
    special = set(preprocessing.tokenizer.special_ids.values())
    added = preprocessing.tokenizer.encode("")  # what the tokenizer itself puts first (BOS, or nothing)
    assert ids[:len(added)] == added
    assert not special & set(ids[len(added):]), f"{prompt!r} became control tokens: {ids}"
    assert b"".join(token_table[i] for i in ids) == prompt.encode()
