"""Tool calling between the model and its clients: how tools and earlier calls are written into the prompt, what the
model writes to call a tool, and the guides that hold it to that (docs/openai.md, "Tool calling").

One call format for every model: ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` — the format of the
Hermes and Qwen 2.5 tool templates, which many instruct models were trained on. A chat template that writes tool calls
this way renders tools and calls itself (``native``); for any other template (the default SmolLM2 has no tool format)
the tools are described in a system message and calls and results are written as text (``fallback_messages``), so the
prompt and the guide always agree on the format. The guide (``tool_guide``) is a structural tag (xgrammar's, and
TensorRT-LLM's ``GuideType.STRUCTURAL_TAG``): once the model writes ``<tool_call>`` it must finish a call of one of the
offered tools whose arguments match that tool's ``parameters``; before that it writes text freely (``auto``), or
nothing (``required`` and a named tool).

Messages here are the ensemble's ``messages`` (serving/chat.py validates them): OpenAI's chat messages with string
content — ``tool_calls`` on assistant messages (``{"id", "type": "function", "function": {"name", "arguments"}}``,
arguments a JSON string) and ``role: "tool"`` results with ``tool_call_id``.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
RESULT_BEGIN, RESULT_END = "<tool_response>", "</tool_response>"
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
TOOL_CHOICES = ("none", "auto", "required")


class ToolError(ValueError):
    """A tools request the user must fix."""


def functions(tools: list[dict]) -> list[dict]:
    """The function definitions of OpenAI chat ``tools`` (``{"type": "function", "function": {...}}``), checked."""
    found = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got "
                            f"{json.dumps(name)}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolError(f"tools[{i}].function.parameters must be a JSON Schema of an object (a function's "
                            "arguments are a JSON object)")
        if name in {f["name"] for f in found}:
            raise ToolError(f"tools[{i}]: a second function named {name!r}")
        found.append({"name": name, "description": function.get("description") or "", "parameters": parameters})
    return found


def call_begin(name: str) -> str:
    return f'{CALL_BEGIN}{{"name": "{name}", "arguments": '


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (``arguments``: JSON text of an object)."""
    return f"{call_begin(name)}{arguments}}}{CALL_END}"


def tools_text(specs: list[dict]) -> str:
    """The tools and the call format, for a system message (templates without a tool format of their own)."""
    listed = "\n".join(json.dumps({"type": "function", "function": spec}, ensure_ascii=False) for spec in specs)
    return (f"You may call these functions:\n{listed}\nTo call one, write "
            f'{CALL_BEGIN}{{"name": "function_name", "arguments": {{...}}}}{CALL_END}; '
            f"its result comes back as {RESULT_BEGIN}...{RESULT_END}.")


def native(template: str | None) -> bool:
    """The template renders tools, and writes calls in this module's format: it gets them as they are."""
    return bool(template) and "tools" in template and CALL_BEGIN in template


def fallback_messages(messages: list[dict], specs: list[dict] | None) -> list[dict]:
    """``messages`` with tools, calls and results as plain ``role``/``content`` text (a template without a tool
    format): the tools in the (first) system message, calls after the assistant's text, consecutive results in one
    user turn."""
    out: list[dict] = []
    if specs:
        if messages and messages[0]["role"] == "system":
            first, messages = messages[0], messages[1:]
            out.append({"role": "system", "content": f"{first['content']}\n\n{tools_text(specs)}"})
        else:
            out.append({"role": "system", "content": tools_text(specs)})
    for message in messages:
        role = message["role"]
        if role == "tool":
            result = f"{RESULT_BEGIN}\n{message['content']}\n{RESULT_END}"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        content = message["content"]
        if role == "assistant" and message.get("tool_calls"):
            calls = "".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": role, "content": content})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def native_messages(messages: list[dict]) -> list[dict]:
    """``messages`` as Hugging Face chat templates take tool calls: arguments as objects, not JSON text."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                for call in message["tool_calls"]]}
        out.append(message)
    return out


def tool_guide(specs: list[dict], choice: str | dict, parallel: bool) -> dict | None:
    """The structural tag for ``tool_choice``: None for ``none`` (no call can be made); ``auto``: text, and any
    call after a ``<tool_call>``; ``required``: calls only, one or more; a named function: exactly that call.
    ``parallel``: more calls may follow the first (OpenAI's ``parallel_tool_calls``)."""
    def tag(spec: dict) -> dict:
        # At most one whitespace character between JSON tokens: a model cannot loop on newlines inside a call (the
        # guide's own JSON format has no separators option; json.dumps's and compact JSON both fit).
        return {"type": "tag", "begin": call_begin(spec["name"]), "end": "}" + CALL_END,
                "content": {"type": "json_schema", "json_schema": spec["parameters"], "max_whitespace_cnt": 1}}

    if choice == "none":
        return None
    if isinstance(choice, dict):
        spec = next((s for s in specs if s["name"] == choice["function"]["name"]), None)
        if spec is None:
            raise ToolError(f"tool_choice names the function {choice['function']['name']!r}, which is not in tools")
        return {"type": "structural_tag", "format": tag(spec)}
    if choice == "required":
        return {"type": "structural_tag", "format": {
            "type": "tags_with_separator", "tags": [tag(s) for s in specs], "separator": "", "at_least_one": True,
            "stop_after_first": not parallel}}
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": [CALL_BEGIN], "tags": [tag(s) for s in specs],
        "stop_after_first": not parallel}}


def arguments_object(text: str) -> Any:
    """The arguments a call's JSON text holds; ToolError unless it is a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ToolError("arguments must be a JSON object")
    return value
