"""OpenAI's request and response schema for the routes served here, as strict pydantic models.

Requests are ``extra="forbid"`` and ``strict``: an unknown field or a value of the wrong type is a 400 naming it,
never silently dropped or coerced. Parameters OpenAI has but the engine cannot honour are declared so they can be
refused by name; only their "off" value (``logit_bias: {}``, ``tool_choice: "none"``…) is accepted, since that asks
for nothing. ``repetition_penalty`` and ``min_p`` are accepted as extra body parameters, as vLLM does. Responses carry
every field the official SDK reads.
"""

from __future__ import annotations

import time
import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from serving.openai.errors import bad_request

# A seed is an int64 in OpenAI's schema; the engine's is a uint64 (negative seeds wrap, two's complement).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_STOP = 4
MAX_CHOICES = 8  # n: the engine's num_return_sequences limit
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, OpenAI's limit
MAX_COMPLETION_LOGPROBS = 5  # legacy completions' logprobs, OpenAI's limit
VERY_UNLIKELY = -9999.0  # OpenAI's log-prob for a token that could not be picked (JSON has no -Infinity)

# Parameters the engine cannot honour, with the only values that ask for nothing (accepted: ignoring them ignores no
# request). Anything else is refused with a 400 naming the parameter.
_CHAT_OFF: dict[str, tuple] = {
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,), "functions": (None, []),
    "function_call": (None, "none"), "store": (None, False), "metadata": (None, {}), "service_tier": (None, "auto"),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,), "reasoning_effort": (None,),
    "web_search_options": (None,), "verbosity": (None,), "prompt_cache_key": (None,), "safety_identifier": (None,),
}
_COMPLETION_OFF: dict[str, tuple] = {
    "logit_bias": (None, {}), "best_of": (None, 1), "echo": (None, False), "suffix": (None,),
}


def _is_off(value, allowed: tuple) -> bool:
    for off in allowed:
        if isinstance(value, bool) or isinstance(off, bool):  # False is not 0 here: logprobs 0 is no boolean
            if isinstance(value, bool) and isinstance(off, bool) and value == off:
                return True
        elif value == off:
            return True
    return False


def _refuse_unsupported(values: dict, off: dict[str, tuple]) -> dict:
    """Refuse what asks the engine for something it cannot do; drop what asks for nothing (its "off" value)."""
    for name, allowed in off.items():
        if name in values and not _is_off(values[name], allowed):
            raise bad_request(f"'{name}' is not supported by this server: the engine cannot honour it "
                              "(docs/openai.md lists the parameters it can)", param=name, code="unsupported_parameter")
    return {key: value for key, value in values.items() if key not in off}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool | None = None


class _Sampling(_Request):
    """What chat and completions share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    # OpenAI's range; they map onto TensorRT-LLM's same-named penalties (docs/openai.md: what differs).
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    # Extra body parameters (vLLM's): TensorRT-LLM's repetition penalty (> 0, 1 is off) and min_p.
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(None, ge=0, le=1)
    user: str | None = None  # accepted and ignored: it identifies the end user to OpenAI, asks nothing of the engine
    refused: ClassVar[dict[str, tuple]] = {}  # per endpoint: what the engine cannot honour, and its "off" values

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, values):
        return _refuse_unsupported(values, cls.refused) if isinstance(values, dict) else values

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop):
        words = [stop] if isinstance(stop, str) else (stop or [])
        if len(words) > MAX_STOP:
            raise ValueError(f"'stop' takes at most {MAX_STOP} sequences, got {len(words)}")
        if any(w == "" for w in words):
            raise ValueError("'stop' sequences must not be empty strings")
        return stop

    @field_validator("n")
    @classmethod
    def _n(cls, n):
        if n is not None and not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"'n' must be between 1 and {MAX_CHOICES} (choices per request), got {n}")
        return n

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        return self

    @property
    def stop_words(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def choices(self) -> int:
        return 1 if self.n is None else self.n


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    # "developer" is OpenAI's newer name for the system role (its SDK sends it for some models): same meaning.
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def plain(self) -> dict[str, str]:
        """The ensemble's {role, content}; text parts are joined as OpenAI joins them (no separator)."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class JSONSchemaFormat(_Request):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict = Field(alias="schema")  # required here: without a schema there is nothing to enforce
    # Accepted either way: the schema is always enforced (docs/openai.md).
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise bad_request("'response_format.json_schema' is required with type 'json_schema' and allowed only "
                              "with it", param="response_format.json_schema")
        return self


class ChatCompletionRequest(_Sampling):
    refused: ClassVar[dict[str, tuple]] = _CHAT_OFF
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _max_tokens(self):
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise bad_request("'max_tokens' and 'max_completion_tokens' differ: send one of them", param="max_tokens")
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
        return self

    @property
    def alternatives(self) -> int | None:
        """How many alternatives per token to return, when log-probs are asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    refused: ClassVar[dict[str, tuple]] = _COMPLETION_OFF
    prompt: str | list[str]
    # The legacy endpoint's logprobs: how many alternatives per token (0: only the chosen token's log-prob).
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError(f"'prompt' must be one string (or a list of exactly one), got a list of {len(prompt)}")
        text = prompt if isinstance(prompt, str) else prompt[0]
        if not text:
            raise ValueError("'prompt' is empty: send at least one character")
        return prompt

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def alternatives(self) -> int | None:
        return self.logprobs


# ------------------------------------------------------------------------------------------------- responses

FinishReason = Literal["stop", "length"]


def json_logprob(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else VERY_UNLIKELY


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class TopLogprob(_Response):
    token: str
    bytes: list[int]  # the token's UTF-8 bytes: a character split across tokens is whole only when joined
    logprob: float


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Response):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(_Response):
    """The legacy format: per token its text, log-prob, the alternatives as {token: log-prob} (the chosen token
    included), and where its text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class ChatChoice(_Response):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None = None


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler):
        # OpenAI's last chunk carries "delta": {}, not nulls (strict clients compare against its stream).
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(_Response):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: None = None


class CompletionChoice(_Response):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class TextCompletion(_Response):
    """A completion and each of its streamed chunks alike: OpenAI uses one ``text_completion`` object for both."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "triton-llm-stack"
    max_model_len: int  # vLLM's name for the context length (prompt + completion tokens)


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
