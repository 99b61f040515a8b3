"""The Responses API (``POST /v1/responses``, stateless): one answer as a ``response`` object with ``output`` items,
or as the SSE events the official SDK's stream reads, built from the same pieces the chat endpoint makes.

A request is run as the chat completion it amounts to (protocol.py ``ResponsesRequest.chat``); its text and calls
(serving/openai/tool_parser.py) become output items in the order they came: a ``message`` item with one
``output_text`` part for text, a ``function_call`` item per call. Streamed, each item is announced
(``response.output_item.added``), filled (``response.output_text.delta`` / ``response.function_call_arguments.delta``)
and closed (``…done`` events, then ``response.output_item.done``) before the next begins, between
``response.created`` / ``response.in_progress`` and ``response.completed`` (``response.incomplete`` when the output
ran out of tokens); every event has its ``sequence_number``. The whole answer (not streamed) is the same machine run on
the whole text, so both give the same items.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator

from serving.openai.protocol import ResponsesRequest
from serving.openai.tool_parser import CallDelta


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    """One response's items and events. ``add`` takes the next content text and call deltas, ``finish`` the end."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.req, self.model = req, model
        self.id, self.created = _id("resp"), int(time.time())
        self.output: list[dict] = []
        self._open: dict | None = None  # the item being filled
        self._calls: dict[int, dict] = {}  # call index (the parser's) → its item
        self._sequence = 0
        self.status, self.usage, self.incomplete = "in_progress", None, None

    # ---- the response object
    def response(self) -> dict:
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else \
            {"type": "text"}
        choice = req.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": self.status,
            "model": self.model, "output": self.output, "error": None,
            "incomplete_details": {"reason": self.incomplete} if self.incomplete else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": req.temperature, "top_p": req.top_p, "text": {"format": fmt},
            "tool_choice": (choice.model_dump() if hasattr(choice, "model_dump") else choice) or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()], "metadata": {},
            "store": False, "previous_response_id": None, "usage": self.usage,
        }

    # ---- events
    def event(self, kind: str, **fields) -> str:
        self._sequence += 1
        data = {"type": kind, "sequence_number": self._sequence - 1, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self) -> Iterator[str]:
        yield self.event("response.created", response=self.response())
        yield self.event("response.in_progress", response=self.response())

    def add(self, text: str, calls: list[CallDelta]) -> Iterator[str]:
        if text:
            yield from self._text(text)
        for delta in calls:
            if delta.id is not None:  # a new call: the item before it is done
                yield from self._close()
                item = {"type": "function_call", "id": _id("fc"), "call_id": delta.id, "name": delta.name,
                        "arguments": "", "status": "in_progress"}
                self._calls[delta.index] = self._open = item
                self.output.append(item)
                yield self.event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))
            item = self._calls[delta.index]
            if delta.arguments:
                item["arguments"] += delta.arguments
                yield self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=self.output.index(item), delta=delta.arguments)

    def finish(self, finish_reason: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> Iterator[str]:
        yield from self._close()
        self.usage = {"input_tokens": input_tokens,
                      "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
                      "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": input_tokens + output_tokens}
        if finish_reason == "length":
            self.status, self.incomplete = "incomplete", "max_output_tokens"
            yield self.event("response.incomplete", response=self.response())
        else:
            self.status = "completed"
            yield self.event("response.completed", response=self.response())

    def _text(self, text: str) -> Iterator[str]:
        item = self._open
        if item is None or item["type"] != "message":
            yield from self._close()
            item = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant", "content": []}
            self._open = item
            self.output.append(item)
            index = len(self.output) - 1
            yield self.event("response.output_item.added", output_index=index, item=json.loads(json.dumps(item)))
            item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            yield self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        item["content"][0]["text"] += text
        yield self.event("response.output_text.delta", item_id=item["id"], output_index=self.output.index(item),
                          content_index=0, delta=text, logprobs=[])

    def _close(self) -> Iterator[str]:
        item, self._open = self._open, None
        if item is None:
            return
        index = self.output.index(item)
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            yield self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                              text=part["text"], logprobs=[])
            yield self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                              part=part)
        else:
            yield self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              arguments=item["arguments"])
        yield self.event("response.output_item.done", output_index=index, item=item)
