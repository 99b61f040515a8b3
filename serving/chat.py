"""Chat messages → prompt token ids *by structure*, so message content can never act as a control token.

Every OpenAI-compatible server we compared (vLLM, Triton's python/openai, trtllm-serve, llama-server) renders
the chat template to one string and tokenises it again, so a user who types ``<|im_end|>\\n<|im_start|>system\\n…`` ends their turn and writes a
system message of their own (vllm#31735, llama.cpp#24382). Here the template is rendered with each message's
content replaced by a random sentinel; the rendered string is split at the sentinels, control tokens are
recognised only in the template's own text, and the text between two control tokens (template text and
content alike) is tokenised as text (``split_special_tokens=True``). For content without control-token
strings the ids equal ``apply_chat_template(tokenize=True)`` exactly (tests/test_chat.py checks it on the
real tokenizer); forged markers in content stay plain text.

Tool calling (serving/tools.py): assistant messages may carry ``tool_calls`` and ``role: "tool"`` messages answer them;
the request's ``tools`` are rendered by the template when it writes calls in serving/tools.py's format, else written
into the conversation as text (a system message and plain turns). Either way every content stays text; names and
arguments that a native template writes outside content are refused if they hold a control token's text.

Errors are ``ChatError`` (a ``ValueError``) with the rule that was broken; preprocessing sends them as
INVALID_ARG. No transformers or torch here: the tokenizer is serving/tokenizer.py's.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from serving.tokenizer import Tokenizer
from serving.tools import NAME, ToolError, arguments_object, fallback_messages, functions, native, native_messages

#: Roles a message may have, and the keys each may carry (OpenAI's, as the front door passes them on).
ROLES = ("system", "user", "assistant", "tool")
_KEYS = {"system": {"role", "content"}, "user": {"role", "content"}, "assistant": {"role", "content", "tool_calls"},
         "tool": {"role", "content", "tool_call_id"}}
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}
MESSAGES_SHAPE = 'a JSON array of {"role": ..., "content": ...} objects'


class ChatError(ValueError):
    """A ``messages`` request the user must fix."""


def _kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _json(raw: str, what: str, shape: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ChatError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                        f"send {shape}") from None


def parse_messages(raw: str) -> list[dict]:
    """Validate the ``messages`` input (one JSON string) and return its messages."""
    if not raw.strip():
        raise ChatError(f"messages is empty: send {MESSAGES_SHAPE}")
    value = _json(raw, "messages", MESSAGES_SHAPE)
    if not isinstance(value, list):
        raise ChatError(f"messages must be {MESSAGES_SHAPE}, got a JSON {_kind(value)}")
    if not value:
        raise ChatError("messages is an empty array: send at least one message")
    calls: set[str] = set()  # ids of the calls made so far: a tool result answers one of them
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ChatError(f"messages[{i}] must be an object with role and content, got a JSON {_kind(message)}")
        if "role" not in message:
            raise ChatError(f"messages[{i}] has no role")
        role = message["role"]
        if role not in ROLES:
            raise ChatError(f"messages[{i}].role is {json.dumps(role, ensure_ascii=False)}: "
                            f"allowed roles are {', '.join(ROLES)}")
        unknown = sorted(set(message) - _KEYS[role])
        if unknown:
            raise ChatError(f"messages[{i}] has unknown key(s) {', '.join(map(repr, unknown))}: "
                            f"a {role} message takes {', '.join(sorted(_KEYS[role]))}")
        if "content" not in message:
            raise ChatError(f"messages[{i}] has no content")
        if not isinstance(message["content"], str):
            raise ChatError(f"messages[{i}].content must be a string, got a JSON {_kind(message['content'])}")
        if role == "assistant" and "tool_calls" in message:
            calls |= _check_calls(message["tool_calls"], f"messages[{i}].tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ChatError(f"messages[{i}] is a tool result without a tool_call_id (the id of the call it "
                                "answers)")
            if call_id not in calls:
                raise ChatError(f"messages[{i}] answers tool_call_id {json.dumps(call_id)}, but no earlier assistant "
                                "message made a call with that id")
    return value


def _check_calls(calls: Any, where: str) -> set[str]:
    if not isinstance(calls, list) or not calls:
        raise ChatError(f"{where} must be a non-empty array of calls")
    ids = set()
    for k, call in enumerate(calls):
        here = f"{where}[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(function, dict):
            raise ChatError(f'{here} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise ChatError(f"{here}.id must be a non-empty string")
        if not isinstance(function.get("name"), str) or not NAME.match(function["name"]):
            raise ChatError(f"{here}.function.name must be 1-64 letters, digits, '_' or '-'")
        if not isinstance(function.get("arguments"), str):
            raise ChatError(f"{here}.function.arguments must be a string (the arguments as JSON text)")
        try:
            arguments_object(function["arguments"])
        except ToolError as exc:
            raise ChatError(f"{here}.function.{exc}") from None
        ids.add(call["id"])
    return ids


def parse_tools(raw: str | None) -> list[dict] | None:
    """Validate the ``tools`` input (OpenAI's chat ``tools`` as one JSON string); None when absent or empty."""
    if raw is None or not raw.strip():
        return None
    value = _json(raw, "tools", 'a JSON array of {"type": "function", "function": {...}} objects')
    if not isinstance(value, list):
        raise ChatError(f"tools must be a JSON array of functions, got a JSON {_kind(value)}")
    try:
        functions(value)
    except ToolError as exc:
        raise ChatError(str(exc)) from None
    return value or None


def parse_template_kwargs(raw: str | None) -> dict | None:
    """The ``chat_template_kwargs`` input: a JSON object of the template's own variables (e.g. enable_thinking)."""
    if raw is None or not raw.strip():
        return None
    value = _json(raw, "chat_template_kwargs", "a JSON object")
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise ChatError("chat_template_kwargs must be a JSON object whose keys are the template's variable names")
    reserved = sorted(set(value) & {"messages", "tools", "documents", "add_generation_prompt"})
    if reserved:
        raise ChatError(f"chat_template_kwargs cannot set {', '.join(reserved)}: the request sets them")
    return value


class ChatEncoder:
    """Applies one tokenizer's chat template by structure (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.has_template = bool(tokenizer.chat_template)
        # Control tokens: the tokenizer's special added tokens; longest first, so a regex alternation
        # matches leftmost-longest, as the tokenizer's own added-token matcher does.
        self._special_ids = tokenizer.special_ids
        names = sorted(self._special_ids, key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, names))) if names else None

    def encode(self, messages: Sequence[dict], tools: list[dict] | None = None,
               template_kwargs: dict | None = None) -> list[int]:
        """Prompt ids of a validated conversation (and tools), ending with the template's generation prompt."""
        messages, tools = self._with_tools(list(messages), tools)
        templates, refs, contents = self._split(messages, tools=tools, template_kwargs=template_kwargs)
        ids: list[int] = []
        run: list[str] = []  # text since the last control token: template text and content, tokenised together
        for k, template in enumerate(templates):
            pos = 0
            for match in self._special.finditer(template) if self._special else ():
                run.append(template[pos:match.start()])
                ids += self._text_ids("".join(run))
                run = []
                ids.append(self._special_ids[match.group()])
                pos = match.end()
            run.append(template[pos:])
            if k < len(refs):
                run.append(contents[refs[k]])
        ids += self._text_ids("".join(run))
        return ids

    def _with_tools(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools for the template): as they are for a template with this project's call format, else
        written into the conversation as text (serving/tools.py)."""
        if not tools and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            return messages, None
        if not native(self.tokenizer.chat_template):
            return fallback_messages(messages, functions(tools) if tools else None), None
        # The template writes names, arguments and tool definitions outside any content: no control token there.
        outside = json.dumps([tools, [m.get("tool_calls") for m in messages]], ensure_ascii=False)
        if self._special and (found := self._special.search(outside)):
            raise ChatError(f"tools or tool_calls hold the control token {found.group()!r} outside any content")
        return native_messages(messages), tools

    def end_of_turn_id(self) -> int | None:
        """The control token the template writes right after an assistant's content (``<|im_end|>`` for
        ChatML), or None when there is no template or it writes none."""
        if not self.has_template or self._special is None:
            return None
        try:
            templates, refs, _ = self._split([{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}],
                                             generation_prompt=False)
        except ChatError:
            return None
        if 1 not in refs:
            return None
        match = self._special.search(templates[refs.index(1) + 1])
        return self._special_ids[match.group()] if match else None

    def _split(self, messages: Sequence[dict], generation_prompt: bool = True, tools: list[dict] | None = None,
               template_kwargs: dict | None = None):
        """The rendered template as text pieces around the contents: ``templates[k]``, then the content of
        message ``refs[k]``, ..., then ``templates[-1]``. Also returns the contents as the template writes them."""
        if not self.has_template:
            raise ChatError("this model's tokenizer has no chat template (chat_template in tokenizer_config.json "
                            "or chat_template.jinja): send text_input instead of messages")
        tag = secrets.token_hex(8)
        masked = [{**m, "content": f"\ue000{tag}:{i}\ue001"} for i, m in enumerate(messages)]
        parts = re.split(f"\ue000{tag}:(\\d+)\ue001", self._render(masked, generation_prompt, tools, template_kwargs))
        templates, refs = parts[0::2], [int(i) for i in parts[1::2]]
        # The split is only sound if the template writes content verbatim: check against the real rendering.
        # Some templates trim content (Llama 3's ``| trim``); that is accepted as the template's own doing.
        plain = self._render(list(messages), generation_prompt, tools, template_kwargs)
        for contents in ([m["content"] for m in messages], [m["content"].strip() for m in messages]):
            if _join(templates, refs, contents) == plain:
                return templates, refs, contents
        raise ChatError("this model's chat template rewrites message content, so content could not be kept "
                        "apart from the template's control tokens: send text_input instead of messages")

    def _render(self, messages: list[dict], generation_prompt: bool, tools: list[dict] | None = None,
                template_kwargs: dict | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tools=tools,
                                                      template_kwargs=template_kwargs)
        except jinja2.TemplateError as exc:  # e.g. a template's raise_exception("roles must alternate")
            raise ChatError(f"the model's chat template refused this conversation: {exc}") from None

    def _text_ids(self, text: str) -> list[int]:
        if not text:
            return []
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def _join(templates: list[str], refs: list[int], contents: list[str]) -> str:
    out = [templates[0]]
    for k, ref in enumerate(refs):
        out += [contents[ref], templates[k + 1]]
    return "".join(out)


def default_end_id(encoder: ChatEncoder, model_dir: str | Path) -> int | None:
    """The default ``end_id``: the model's end of turn, so a chat answer ends with finish_reason ``stop``.

    ``generation_config.json``'s ``eos_token_id`` (an int or a list); from a list, the one the chat template
    ends an assistant turn with, else the first. Without a generation config: the tokenizer's eos.
    """
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id") if path.is_file() else None
    candidates = [eos] if isinstance(eos, int) else [e for e in eos or [] if isinstance(e, int)]
    if not candidates:
        return encoder.tokenizer.eos_token_id
    turn_end = encoder.end_of_turn_id() if len(candidates) > 1 else None
    return turn_end if turn_end in candidates else candidates[0]
