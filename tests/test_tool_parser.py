"""serving/openai/tool_parser.py alone: however the model's text is cut into pieces, the content and calls that come
out are the same as from the whole text, and nothing that is not a call of an offered tool becomes one."""

from __future__ import annotations

import json
import random

import pytest

from serving.openai.tool_parser import ToolCallParser
from serving.tools import call_begin, call_text

NAMES = frozenset({"get_weather", "get_time"})
CALL = call_text("get_weather", '{"city": "Paris", "note": "a}b\\"c"}')


def run(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str, bool]], list]:
    parser, content, deltas = ToolCallParser(NAMES), "", []
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        piece, more = parser.feed(text[start:end])
        content += piece
        deltas += more
    rest, more = parser.finish()
    return content + rest, [(c.name, c.arguments, c.complete) for c in parser.calls], deltas + more


@pytest.mark.parametrize("text", [
    "Just text, no call.",
    CALL,
    f"Let me look that up. {CALL}",
    CALL + call_text("get_time", "{}") + " done",
    "a < b and <tool_ca",  # a marker's beginning at the end is text once the choice ends
    '<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call> nope',  # not an offered tool
    "<tool_call>not json at all</tool_call>",
    call_begin("get_weather") + '{"city": "Pa',  # cut by max_tokens inside the arguments
])
def test_pieces_give_what_the_whole_text_gives(text):
    whole = run(text, [])
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        content, calls, deltas = run(text, cuts)
        assert (content, calls) == whole[:2], cuts
        joined = {}
        for d in deltas:  # the streamed deltas join to the calls
            joined.setdefault(d.index, {"name": d.name, "arguments": ""})["arguments"] += d.arguments
        assert [(j["name"], j["arguments"]) for j in joined.values()] == [(n, a) for n, a, _ in calls]


def test_what_comes_out():
    content, calls, _ = run(f"Let me look that up. {CALL}", [])
    assert content == "Let me look that up. "
    assert calls == [("get_weather", '{"city": "Paris", "note": "a}b\\"c"}', True)]
    assert json.loads(calls[0][1])["note"] == 'a}b"c'
    content, calls, _ = run('<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call> nope', [])
    assert calls == [] and content.startswith("<tool_call>") and content.endswith(" nope")
    assert run(call_begin("get_weather") + '{"city": "Pa', [])[1] == [("get_weather", '{"city": "Pa', False)]


def test_a_control_character_in_a_string_is_escaped():
    _, calls, _ = run(call_text("get_weather", '{"city": "a\x05b"}'), [])
    assert json.loads(calls[0][1]) == {"city": "a\x05b"}  # valid JSON, the same value
