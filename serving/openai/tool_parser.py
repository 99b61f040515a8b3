"""A choice's text → OpenAI's assistant content and ``tool_calls``, incrementally (serving/tools.py's call format).

The model writes text and ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` calls; the tool guide holds it
to that (serving/tools.py), so a call is whole unless the request ran out of tokens inside it. ``feed`` takes text as
it streams and returns what can go out now: content (never a piece of a ``<tool_call>`` marker) and call deltas in
OpenAI's streamed shape — a call's first delta carries its ``index``, ``id``, ``type`` and ``name`` with empty
``arguments``, the next ones only ``index`` and a piece of the arguments' JSON text. The whole text fed at once gives
the same calls, so streamed deltas join to the non-streamed call. Text that only looks like a call (a name not among
the tools) is returned as content, never an error.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from serving.tools import CALL_BEGIN, CALL_END

# What follows <tool_call> before the arguments' value (the guide writes exactly '{"name": "X", "arguments": ').
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_MAX_HEAD = 160  # a head this long without a match is text


@dataclass
class CallDelta:
    index: int
    arguments: str
    id: str | None = None  # the first delta of a call: its id and name
    name: str | None = None


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False  # its JSON ended (a call cut by max_tokens is not)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCallParser:
    names: frozenset[str]
    calls: list[ToolCall] = field(default_factory=list)
    _state: str = "text"  # text → head → arguments → tail → text
    _buf: str = ""
    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """Content and call deltas that ``text`` (the next piece of the choice's text) lets out."""
        self._buf += text
        content, deltas = [], []
        while True:
            if self._state == "text":
                at = self._buf.find(CALL_BEGIN)
                if at < 0:
                    keep = _partial_suffix(self._buf, CALL_BEGIN)
                    content.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._buf[:at])
                self._buf, self._state = self._buf[at + len(CALL_BEGIN):], "head"
            elif self._state == "head":
                match = _HEAD.match(self._buf)
                if match and match.group(1) in self.names:
                    call = ToolCall(new_call_id(), match.group(1))
                    self.calls.append(call)
                    deltas.append(CallDelta(len(self.calls) - 1, "", call.id, call.name))
                    self._buf, self._state = self._buf[match.end():], "arguments"
                    self._depth, self._in_string, self._escape = 0, False, False
                elif match or CALL_END in self._buf or len(self._buf) > _MAX_HEAD:
                    # Not a call of an offered tool: the marker and what followed are text.
                    end = self._buf.find(CALL_END)
                    end = len(self._buf) if end < 0 else end + len(CALL_END)
                    content.append(CALL_BEGIN + self._buf[:end])
                    self._buf, self._state = self._buf[end:], "text"
                else:
                    break  # the head is still coming
            elif self._state == "arguments":
                piece, done = self._scan_arguments()
                if piece:
                    self.calls[-1].arguments += piece
                    deltas.append(CallDelta(len(self.calls) - 1, piece))
                if not done:
                    break
                self.calls[-1].complete = True
                self._state = "tail"
            else:  # tail: the call object's closing brace, then the end marker
                at = self._buf.find(CALL_END)
                if at < 0:
                    break
                self._buf, self._state = self._buf[at + len(CALL_END):], "text"
        return "".join(content), _merge(deltas)

    def finish(self) -> tuple[str, list[CallDelta]]:
        """At the end of the choice: what was held back. A call whose head never completed is text."""
        if self._state in ("text", "head"):
            rest = self._buf if self._state == "text" else CALL_BEGIN + self._buf
            self._buf, self._state = "", "text"
            return rest, []
        self._buf = ""
        return "", []

    def _scan_arguments(self) -> tuple[str, bool]:
        """The arguments' JSON text in the buffer up to where their value ends (string-aware), and whether it did.

        A control character inside a string is written as its JSON escape: xgrammar 0.2.9's structural-tag JSON lets
        raw ones through (seen: U+0005 in a string), which JSON forbids and strict parsers refuse. Escaped, the
        string's value is the same and the arguments parse."""
        out = []
        for i, char in enumerate(self._buf):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._in_string = False
                elif char < " ":
                    char = f"\\u{ord(char):04x}"
            elif self._depth == 0 and char.isspace():
                continue  # before the value: however the text was cut into pieces, the arguments start at it
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    out.append(char)
                    self._buf = self._buf[i + 1:]
                    return "".join(out), True
            out.append(char)
        self._buf = ""
        return "".join(out), False


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (held back: it may become the marker)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _merge(deltas: list[CallDelta]) -> list[CallDelta]:
    """Consecutive argument pieces of one call as one delta (fewer SSE events, the same joined text)."""
    merged: list[CallDelta] = []
    for delta in deltas:
        if merged and delta.id is None and merged[-1].index == delta.index and merged[-1].id is None:
            merged[-1].arguments += delta.arguments
        else:
            merged.append(delta)
    return merged
