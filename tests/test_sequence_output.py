"""The per-sequence response assembly the CPU llm and the GPU ``llm`` wrapper share (serving/sequence_output.py).
Both models run under a real tritonserver in the end-to-end suite (tests/conftest.py ``layout``)."""

from __future__ import annotations

from serving.sequence_output import SequenceOutput, TokenLogprob

# Byte table: ids 0..255 are single bytes, 256 is a special token (empty).
TABLE = [bytes([i]) for i in range(256)] + [b""]
EURO = list("€".encode())  # 3 bytes: a character split across three tokens


def test_streaming_holds_back_split_characters():
    s = SequenceOutput(TABLE, streaming=True, max_tokens=10, num_input_tokens=4)
    assert s.push([ord("a"), EURO[0]]).ids == [ord("a")]
    assert s.push([EURO[1]]) is None  # still inside the character
    c = s.push([EURO[2], ord("b")])
    assert c.ids == EURO + [ord("b")]
    assert (c.num_input_tokens, c.num_output_tokens, c.finish_reason, c.final) == (4, 5, "", False)
    end = s.finish(s.reason_without_engine(cancelled=False))
    assert end.final and end.finish_reason == "stop" and end.ids == [] and end.num_output_tokens == 5


def test_finish_reasons_and_echo():
    s = SequenceOutput(TABLE, streaming=False, max_tokens=3, num_input_tokens=2, echo_ids=[7, 8])
    assert s.push([1, 2]) is None and s.push([3]) is None
    end = s.finish(s.reason_without_engine(cancelled=False))
    assert end.ids == [7, 8, 1, 2, 3] and end.finish_reason == "length" and end.num_output_tokens == 3
    assert SequenceOutput(TABLE, False, 3, 2).reason_without_engine(cancelled=True) == "cancelled"
    s = SequenceOutput(TABLE, streaming=True, max_tokens=5, num_input_tokens=2, echo_ids=[9])
    assert s.push([EURO[0]]).ids == [9]  # the prompt goes out first, even while a character is open


def test_logprobs_follow_the_ids_they_belong_to():
    """A token held back inside a character keeps its log-prob until its text goes out; the echo has none."""
    lp = [TokenLogprob(-0.5, ((ord("a"), -0.5),)), TokenLogprob(-1.0), TokenLogprob(-2.0), TokenLogprob(-0.25)]
    s = SequenceOutput(TABLE, streaming=True, max_tokens=10, num_input_tokens=1, echo_ids=[9], sequence_index=2)
    first = s.push([ord("a"), EURO[0]], lp[:2])
    assert first.ids == [9, ord("a")] and first.logprobs == lp[:1] and first.sequence_index == 2
    assert s.push([EURO[1]], lp[2:3]) is None
    end = s.finish("length")
    assert end.ids == EURO[:2] and end.logprobs == lp[1:3] and end.cum_logprob == -3.5
    whole = SequenceOutput(TABLE, streaming=False, max_tokens=10, num_input_tokens=1)
    whole.push([ord("x"), ord("y")], lp[:2])
    assert whole.finish("stop").logprobs == lp[:2]
