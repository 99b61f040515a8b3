"""Chat messages → prompt token ids *by structure*, so message content can never act as a control token.

Every OpenAI-compatible server we compared (vLLM, Triton's python/openai, trtllm-serve, llama-server) renders
the chat template to one string and tokenises it again, so a user who types ``<|im_end|>\\n<|im_start|>system\\n…`` ends their turn and writes a
system message of their own (vllm#31735, llama.cpp#24382). Here the template is rendered with each message's
content replaced by a random sentinel; the rendered string is split at the sentinels, control tokens are
recognised only in the template's own text, and the text between two control tokens (template text and
content alike) is tokenised as text (``split_special_tokens=True``). For content without control-token
strings the ids equal ``apply_chat_template(tokenize=True)`` exactly (tests/test_chat.py checks it on the
real tokenizer); forged markers in content stay plain text.

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

#: Roles a message may have. ``tool`` is refused: tool results need the OpenAI tool-call fields
#: (``tool_call_id``, an assistant's ``tool_calls``), which we would otherwise have to drop silently.
ROLES = ("system", "user", "assistant")
_KEYS = {"role", "content"}
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}
MESSAGES_SHAPE = 'a JSON array of {"role": ..., "content": ...} objects'


class ChatError(ValueError):
    """A ``messages`` request the user must fix."""


def _kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def parse_messages(raw: str) -> list[dict[str, str]]:
    """Validate the ``messages`` input (one JSON string) and return its messages."""
    if not raw.strip():
        raise ChatError(f"messages is empty: send {MESSAGES_SHAPE}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ChatError(f"messages is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                        f"send {MESSAGES_SHAPE}") from None
    if not isinstance(value, list):
        raise ChatError(f"messages must be {MESSAGES_SHAPE}, got a JSON {_kind(value)}")
    if not value:
        raise ChatError("messages is an empty array: send at least one message")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ChatError(f"messages[{i}] must be an object with role and content, got a JSON {_kind(message)}")
        unknown = sorted(set(message) - _KEYS)
        if unknown:
            raise ChatError(f"messages[{i}] has unknown key(s) {', '.join(map(repr, unknown))}: "
                            "only role and content are accepted")
        for key in ("role", "content"):
            if key not in message:
                raise ChatError(f"messages[{i}] has no {key}")
        role = message["role"]
        if role not in ROLES:
            raise ChatError(f"messages[{i}].role is {json.dumps(role, ensure_ascii=False)}: "
                            f"allowed roles are {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise ChatError(f"messages[{i}].content must be a string, got a JSON {_kind(message['content'])}")
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

    def encode(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt ids of a validated conversation, ending with the template's generation prompt."""
        templates, refs, contents = self._split(messages)
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

    def _split(self, messages: Sequence[dict[str, str]], generation_prompt: bool = True):
        """The rendered template as text pieces around the contents: ``templates[k]``, then the content of
        message ``refs[k]``, ..., then ``templates[-1]``. Also returns the contents as the template writes them."""
        if not self.has_template:
            raise ChatError("this model's tokenizer has no chat template (chat_template in tokenizer_config.json "
                            "or chat_template.jinja): send text_input instead of messages")
        tag = secrets.token_hex(8)
        masked = [{"role": m["role"], "content": f"\ue000{tag}:{i}\ue001"} for i, m in enumerate(messages)]
        parts = re.split(f"\ue000{tag}:(\\d+)\ue001", self._render(masked, generation_prompt))
        templates, refs = parts[0::2], [int(i) for i in parts[1::2]]
        # The split is only sound if the template writes content verbatim: check against the real rendering.
        # Some templates trim content (Llama 3's ``| trim``); that is accepted as the template's own doing.
        plain = self._render(list(messages), generation_prompt)
        for contents in ([m["content"] for m in messages], [m["content"].strip() for m in messages]):
            if _join(templates, refs, contents) == plain:
                return templates, refs, contents
        raise ChatError("this model's chat template rewrites message content, so content could not be kept "
                        "apart from the template's control tokens: send text_input instead of messages")

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt)
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
