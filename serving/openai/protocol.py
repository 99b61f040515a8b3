"""OpenAI's request and response schema for the routes served here, as strict pydantic models.

Every field OpenAI's own API takes for a route is accepted (docs/openai.md lists what each does here): most are
honoured; those that change nothing about the output (``user``, ``metadata``, ``service_tier``, prompt-cache keys,
``prediction``, ``reasoning_effort`` for a model that does not reason…) are accepted and ignored; the few that ask for
something this server cannot give (audio output, web search, stored completions, the deprecated ``functions``) are
refused by name unless they ask for nothing. vLLM's extra body parameters (``top_k``, ``min_tokens``,
``repetition_penalty``, ``min_p``, ``chat_template_kwargs``, ``stream_options.continuous_usage_stats``) are accepted
too. A field no one defines is a 400 naming it, as OpenAI answers (``extra="forbid"``), and values are ``strict``:
never silently coerced. In messages, the fields clients echo back from earlier answers (``refusal``,
``reasoning_content``…) are accepted and dropped. Responses carry every field the official SDK reads.
"""

from __future__ import annotations

import time
import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from serving.openai.errors import bad_request
from serving.request_params import MAX_SEQUENCES as MAX_CHOICES  # n: num_return_sequences at the Triton edge
from serving.request_params import MAX_TOP_LOGPROBS
from serving.tools import ToolError, functions, tool_guide

# A seed is an int64 in OpenAI's schema; the engine's is a uint64 (negative seeds wrap, two's complement).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_STOP = 4
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: -100 bans a token, 100 all but forces it
MAX_COMPLETION_LOGPROBS = 5  # legacy completions' logprobs, OpenAI's limit
VERY_UNLIKELY = -9999.0  # OpenAI's log-prob for a token that could not be picked (JSON has no -Infinity)

# Parameters the engine cannot honour, with the only values that ask for nothing (accepted: ignoring them ignores no
# request). Anything else is refused with a 400 naming the parameter.
_CHAT_OFF: dict[str, tuple] = {
    "functions": (None, []), "function_call": (None, "none"), "store": (None, False),
    "modalities": (None, ["text"]), "audio": (None,), "web_search_options": (None,), "moderation": (None,),
}
# OpenAI's parameters that ask nothing of the output: accepted, dropped (docs/openai.md).
_CHAT_IGNORED = ("metadata", "service_tier", "prediction", "reasoning_effort", "verbosity", "prompt_cache_key",
                 "prompt_cache_retention", "prompt_cache_options", "safety_identifier")
_COMPLETION_OFF: dict[str, tuple] = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None,),
}


def _is_off(value, allowed: tuple) -> bool:
    for off in allowed:
        if isinstance(value, bool) or isinstance(off, bool):  # False is not 0 here: logprobs 0 is no boolean
            if isinstance(value, bool) and isinstance(off, bool) and value == off:
                return True
        elif value == off:
            return True
    return False


def _refuse_unsupported(values: dict, off: dict[str, tuple], ignored: tuple[str, ...] = ()) -> dict:
    """Refuse what asks the engine for something it cannot do; drop what asks for nothing (its "off" value) and what
    does not touch the output."""
    for name, allowed in off.items():
        if name in values and not _is_off(values[name], allowed):
            raise bad_request(f"'{name}' is not supported by this server: the engine cannot honour it "
                              "(docs/openai.md lists the parameters it can)", param=name, code="unsupported_parameter")
    return {key: value for key, value in values.items() if key not in off and key not in ignored}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: usage so far on every chunk
    include_obfuscation: bool | None = None  # OpenAI's padding against length side channels: nothing to hide here


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
    # Extra body parameters (vLLM's): TensorRT-LLM's repetition penalty (> 0, 1 is off), min_p, top_k (0: no cut)
    # and min_tokens.
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    # Token id (as a string: JSON keys) → added to its logit; TensorRT-LLM's embedding_bias on the GPU layout.
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored: it identifies the end user to OpenAI, asks nothing of the engine
    refused: ClassVar[dict[str, tuple]] = {}  # per endpoint: what the engine cannot honour, and its "off" values
    ignored: ClassVar[tuple[str, ...]] = ()  # per endpoint: what is accepted and changes nothing

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, values):
        return _refuse_unsupported(values, cls.refused, cls.ignored) if isinstance(values, dict) else values

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop):
        words = [stop] if isinstance(stop, str) else (stop or [])
        if len(words) > MAX_STOP:
            raise ValueError(f"'stop' takes at most {MAX_STOP} sequences, got {len(words)}")
        if any(w == "" for w in words):
            raise ValueError("'stop' sequences must not be empty strings")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias):
        for key, value in (bias or {}).items():
            if not key.isdecimal() or int(key) >= 2**31:
                raise ValueError(f"'logit_bias' keys are token ids (decimal strings like \"1234\"), got {key!r}")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"'logit_bias' values must be between -100 and 100, got {value} for token {key}")
        return bias

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
    def token_bias(self) -> dict[int, float]:
        return {int(key): value for key, value in (self.logit_bias or {}).items()}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def choices(self) -> int:
        return 1 if self.n is None else self.n


class TextPart(_Request):
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: dict | None = None  # OpenAI's prompt caching hint: nothing to do here


class RefusalPart(_Request):
    type: Literal["refusal"]
    refusal: str


class _Echo(BaseModel):
    """A part of a message that clients send back as they got it: fields beyond the ones read are dropped."""

    model_config = ConfigDict(extra="ignore", strict=True)


class CallFunction(_Echo):
    name: str
    arguments: str


class ToolCall(_Echo):
    id: str
    type: Literal["function"] = "function"
    function: CallFunction


class ChatMessage(_Request):
    # "developer" is OpenAI's newer name for the system role (its SDK sends it for some models): same meaning.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = None  # a participant's name: accepted, not rendered (no template here uses it)
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a tool result answers
    # Echoed from earlier answers and dropped: the assistant's refusal, reasoning (DeepSeek's / vLLM's names), audio.
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    audio: dict | None = None
    function_call: None = None  # the deprecated function calling: use tools (refused when set)

    @model_validator(mode="after")
    def _role_fields(self):
        role = self.role
        if role != "assistant" and self.tool_calls is not None:
            raise ValueError(f"a {role} message has no tool_calls: only assistant messages make calls")
        if role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        if role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"a {role} message has no tool_call_id: only tool messages answer calls")
        if self.content is None and not (role == "assistant" and (self.tool_calls or self.refusal is not None)):
            raise ValueError(f"a {role} message needs content")
        if role != "assistant" and isinstance(self.content, list) and any(isinstance(p, RefusalPart)
                                                                             for p in self.content):
            raise ValueError("refusal parts belong to assistant messages")
        return self

    def plain(self) -> dict:
        """The ensemble's message: role, content as one string (text parts joined as OpenAI joins them, no
        separator), and an assistant's calls or a tool result's call id."""
        if isinstance(self.content, list):
            content = "".join(p.text for p in self.content if isinstance(p, TextPart))
        else:
            content = self.content or ""
        message: dict = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                     for c in self.tool_calls]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionDefinition(_Request):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # accepted either way: the arguments are always held to the schema


class ToolDefinition(_Request):
    type: Literal["function"]
    function: FunctionDefinition

    def openai(self) -> dict:
        """The tool as the ensemble's ``tools`` input takes it (serving/tools.py checks it again)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class AllowedTools(_Request):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice]


class AllowedToolsChoice(_Request):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


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
    ignored: ClassVar[tuple[str, ...]] = _CHAT_IGNORED
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None  # vLLM's: the chat template's own variables (e.g. enable_thinking)

    @model_validator(mode="after")
    def _tool_results_answer_calls(self):
        made: set[str] = set()
        for i, message in enumerate(self.messages):
            made |= {call.id for call in message.tool_calls or ()}
            if message.role == "tool" and message.tool_call_id not in made:
                raise bad_request(f"messages[{i}] answers tool_call_id {message.tool_call_id!r}, but no earlier "
                                  "assistant message made a call with that id", param=f"messages[{i}].tool_call_id",
                                  code="invalid_value")
        return self

    @model_validator(mode="after")
    def _tools(self):
        if self.tools:
            try:
                specs = functions([t.openai() for t in self.tools])
                tool_guide(specs, self.tool_mode, True)
            except ToolError as exc:  # the message starts with what it is about: tools[i]... or tool_choice
                where = str(exc).split(" ", 1)[0]
                raise bad_request(str(exc), param=where if where.startswith("tools[") else "tool_choice",
                                  code="invalid_value") from None
        if self.tool_choice not in (None, "none") and not self.tools:
            raise bad_request("'tool_choice' needs 'tools': there is no tool to call", param="tool_choice")
        if self.tools and self.tool_mode != "none":
            if self.response_format is not None and self.response_format.type != "text":
                raise bad_request("'response_format' cannot be combined with tools the model may call: a call's "
                                  "arguments follow the tool's parameters", param="response_format")
            if self.logprobs:
                raise bad_request("'logprobs' cannot be combined with tools the model may call",
                                  param="logprobs")
        return self

    @property
    def tool_mode(self) -> str | dict:
        """What the model may do with the tools: none, auto, required, or a named function (OpenAI's default:
        auto with tools, none without)."""
        choice = self.tool_choice
        if isinstance(choice, AllowedToolsChoice):
            return choice.allowed_tools.mode
        if isinstance(choice, NamedToolChoice):
            return {"type": "function", "function": {"name": choice.function.name}}
        return choice or ("auto" if self.tools else "none")

    @property
    def offered_tools(self) -> list[dict]:
        """The tools the model is told of: those allowed_tools lists, else all; none for tool_choice none."""
        if not self.tools or self.tool_mode == "none":
            return []
        if isinstance(self.tool_choice, AllowedToolsChoice):
            allowed = {t.function.name for t in self.tool_choice.allowed_tools.tools}
            return [t.openai() for t in self.tools if t.function.name in allowed]
        return [t.openai() for t in self.tools]

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

FinishReason = Literal["stop", "length", "tool_calls"]


def json_logprob(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else VERY_UNLIKELY


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Response):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache, as OpenAI and vLLM report them


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


class FunctionCall(_Response):
    name: str
    arguments: str  # the arguments' JSON text, as the model wrote it


class ToolCallOut(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _without_empty_calls(self, handler):
        data = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)  # OpenAI's message has no tool_calls key when there are none
        return data


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


class DeltaFunction(_Response):
    name: str | None = None
    arguments: str = ""


class DeltaToolCall(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler):
        # The first delta of a call has id, type and name; the next ones only index and an arguments piece.
        data = handler(self)
        data["function"] = {k: v for k, v in data["function"].items() if v is not None}
        return {key: value for key, value in data.items() if value is not None}


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

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


# ----------------------------------------------------------------------- /tokenize and /detokenize (vLLM's shapes)

class TokenizeRequest(_Request):
    """A prompt, or a chat (rendered by the chat template with its tools, as chat completions render it)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] | None = None
    chat_template_kwargs: dict | None = None
    # vLLM's switches, at the only values this server renders with (a chat always ends with the assistant's turn
    # opened; a prompt gets what tokenizer.json adds): other values are refused by name.
    add_generation_prompt: Literal[True] | None = None
    add_special_tokens: Literal[True] | None = None
    return_token_strs: Literal[False] | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("send exactly one of 'prompt' and 'messages'", param="prompt")
        if self.prompt is not None and (self.tools or self.chat_template_kwargs):
            raise bad_request("'tools' and 'chat_template_kwargs' go with 'messages'", param="tools")
        return self


class TokenizeResponse(_Response):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: None = None


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(_Response):
    prompt: str


# ------------------------------------------------------------------------------------------ the Responses API

# Asks for server-side state or hosted features: refused by name unless it asks for nothing.
_RESPONSES_OFF: dict[str, tuple] = {
    "previous_response_id": (None,), "store": (None, False), "conversation": (None,), "background": (None, False),
    "prompt": (None,), "context_management": (None, []), "moderation": (None,), "image": (None,),
    "access_programs": (None,), "top_logprobs": (None, 0),
}
_RESPONSES_IGNORED = ("metadata", "service_tier", "reasoning", "truncation", "safety_identifier", "prompt_cache_key",
                      "prompt_cache_retention", "prompt_cache_options", "user", "include", "stream_options")


class InputText(_Request):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list | None = None  # an assistant's replayed output_text carries them
    logprobs: list | None = None


class InputRefusal(_Request):
    type: Literal["refusal"]
    refusal: str


class MessageItem(_Echo):
    """A message of the conversation (EasyInputMessage, or an earlier output message replayed)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText | InputRefusal]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, InputText))


class FunctionCallItem(_Echo):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Echo):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningItem(_Echo):
    type: Literal["reasoning"]  # echoed from an earlier answer: dropped


class FunctionTool(FunctionDefinition):
    """The Responses API's function tool: the definition itself, flat, not under ``function``."""

    type: Literal["function"]


class NamedFunctionChoice(_Request):
    type: Literal["function"]
    name: str


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # asks nothing of this model's output


class ResponsesRequest(_Request):
    """``POST /v1/responses``, stateless: ``input`` carries the whole conversation."""

    model: str
    input: str | list[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | AllowedToolsChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    stream: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, values):
        if isinstance(values, dict) and values.get("store") is True:
            raise bad_request("'store': true is not supported: this server keeps no responses (send the whole "
                              "conversation in 'input')", param="store", code="unsupported_parameter")
        if isinstance(values, dict) and values.get("previous_response_id"):
            raise bad_request("'previous_response_id' is not supported: this server keeps no responses (send the "
                              "whole conversation in 'input')", param="previous_response_id",
                              code="unsupported_parameter")
        return _refuse_unsupported(values, _RESPONSES_OFF, _RESPONSES_IGNORED) if isinstance(values, dict) else values

    @model_validator(mode="after")
    def _checks(self):
        if self.text and self.text.format and self.text.format.type == "json_schema" and (
                self.text.format.schema_ is None or not self.text.format.name):
            raise bad_request("'text.format' of type json_schema needs 'name' and 'schema'", param="text.format")
        return self

    def chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion (the conversation, the tools, the output format)."""
        messages: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"] and \
                        messages[-1].get("tool_calls"):
                    messages[-1]["tool_calls"].append(call)  # the calls of one turn: one assistant message
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        fmt = self.text.format if self.text else None
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            choice = {"type": "function", "function": {"name": choice.name}}
        elif isinstance(choice, AllowedToolsChoice):
            choice = choice.model_dump()
        body = {
            "model": self.model, "messages": messages, "max_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "stream": self.stream,
            "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                      for t in self.tools] if self.tools else None,
            "tool_choice": choice, "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": None if fmt is None or fmt.type == "text" else
            {"type": "json_object"} if fmt.type == "json_object" else
            {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                    "description": fmt.description, "strict": fmt.strict}},
        }
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None}, strict=False)
