"""The GPU ``llm`` wrapper's per-request stream state. The wrapper itself runs under a real tritonserver in the
end-to-end suite (layout ``trtllm-standin``: tests/conftest.py), over the ``tensorrt_llm`` stand-in."""

from __future__ import annotations

from builders.trtllm.stream_state import StreamState

# Byte table: ids 0..255 are single bytes, 256 is a special token (empty).
TABLE = [bytes([i]) for i in range(256)] + [b""]
EURO = list("€".encode())  # 3 bytes: a character split across three tokens


def test_streaming_holds_back_split_characters():
    s = StreamState(TABLE, streaming=True, max_tokens=10, num_input_tokens=4)
    assert s.push([ord("a"), EURO[0]]).ids == [ord("a")]
    assert s.push([EURO[1]]) is None  # still inside the character
    c = s.push([EURO[2], ord("b")])
    assert c.ids == EURO + [ord("b")]
    assert (c.num_input_tokens, c.num_output_tokens, c.finish_reason, c.final) == (4, 5, "", False)
    end = s.finish()
    assert end.final and end.finish_reason == "stop" and end.ids == [] and end.num_output_tokens == 5


def test_finish_reasons_and_echo():
    s = StreamState(TABLE, streaming=False, max_tokens=3, num_input_tokens=2, echo_ids=[7, 8])
    assert s.push([1, 2]) is None and s.push([3]) is None
    end = s.finish()
    assert end.ids == [7, 8, 1, 2, 3] and end.finish_reason == "length" and end.num_output_tokens == 3
    assert StreamState(TABLE, False, 3, 2).finish(cancelled=True).finish_reason == "cancelled"
    s = StreamState(TABLE, streaming=True, max_tokens=5, num_input_tokens=2, echo_ids=[9])
    assert s.push([EURO[0]]).ids == [9]  # the prompt goes out first, even while a character is open
