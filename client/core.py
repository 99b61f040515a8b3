"""What the sync and asyncio clients share: public types, request tensors, response parsing, timings.

The ensemble follows tensorrtllm_backend's text contract; it has ``max_batch_size > 0``, so every tensor
carries a leading batch dimension of 1.
"""

from __future__ import annotations

import codecs
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


class GenerationError(Exception):
    """A request failed: the server's message (e.g. a validation error) is kept verbatim."""


class ServerUnavailableError(GenerationError):
    """Triton could not be reached at all (refused connection, unknown host, server shutting down)."""

    def __init__(self, url: str, detail: str):
        super().__init__(f"cannot reach Triton at {url}: {detail}")
        self.url = url


GuideType = Literal["json", "json_schema", "regex", "ebnf_grammar", "structural_tag"]
GUIDE_TYPES: tuple[str, ...] = GuideType.__args__


@dataclass(frozen=True)
class Guide:
    """Structured output (TensorRT-LLM's guided decoding): the text must match ``guide`` of kind ``type``.

    ``json``: any JSON value (no guide text); ``json_schema``: a JSON Schema (a JSON string); ``regex``; ``ebnf_grammar``
    (xgrammar's EBNF, rule ``root``); ``structural_tag`` (xgrammar's structural tag JSON: free text with constrained
    parts, e.g. tool calls). The server compiles it before generating and refuses a bad one (INVALID_ARG).
    """

    type: GuideType
    guide: str = ""

    def __post_init__(self):
        if self.type not in GUIDE_TYPES:
            raise ValueError(f"guide type must be one of {', '.join(GUIDE_TYPES)}, got {self.type!r}")
        if self.type == "json" and self.guide:
            raise ValueError("a json guide takes no guide text (any JSON value); use json_schema for a schema")
        if self.type != "json" and not self.guide:
            raise ValueError(f"a {self.type} guide needs its text")

    @classmethod
    def json_schema(cls, schema: Mapping | str) -> Guide:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def structural_tag(cls, tag: Mapping | str) -> Guide:
        return cls("structural_tag", tag if isinstance(tag, str) else json.dumps(tag))


@dataclass
class SamplingParams:
    """Per-request generation settings. ``None`` (or an empty word list) means "not sent": the server's
    default applies (greedy decoding unless temperature/top_k/top_p ask for sampling).

    Penalties follow TensorRT-LLM: ``repetition_penalty`` > 0 (1 = off) divides positive / multiplies negative
    logits of tokens already seen; ``presence_penalty`` is subtracted once from them, ``frequency_penalty`` once per
    occurrence (the server counts prompt and generated tokens). ``min_p``: drop tokens below ``min_p`` × the most
    likely one's probability. ``n``: independent sequences (``generate_n`` / ``chat_n``, or ``stream(...).chunks()``).
    ``logprobs``: each generated token's log-probability; ``top_logprobs``: that many most likely alternatives per
    token too (implies ``logprobs``). ``logit_bias``: token id → a value added to its logit at every step (OpenAI's
    ``logit_bias``; TensorRT-LLM's ``embedding_bias``).
    """

    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)
    min_tokens: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    exclude_input_in_output: bool = True
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    guide: Guide | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def sequences(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs) or bool(self.top_logprobs)


@dataclass(frozen=True)
class Timings:
    """Client-side timings (``time.perf_counter``) of one request, from send to the final response.

    ``ttft_s``: time to the first non-empty text. ``tpot_s``: mean time per output token after the first,
    from the first to the last text chunk; ``None`` when the text came in a single chunk (non-streamed).
    """

    ttft_s: float
    tpot_s: float | None
    total_s: float
    output_tokens: int

    @classmethod
    def measure(cls, start: float, text_times: list[float], end: float, output_tokens: int) -> Timings:
        """``text_times``: when each response carrying non-empty text arrived."""
        first = text_times[0] if text_times else end
        tpot = None
        if len(text_times) > 1 and output_tokens > 1:
            tpot = (text_times[-1] - first) / (output_tokens - 1)
        return cls(ttft_s=first - start, tpot_s=tpot, total_s=end - start, output_tokens=output_tokens)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Output tokens / (total - TTFT); ``None`` when nothing was streamed after the first chunk."""
        decode_s = self.total_s - self.ttft_s
        if self.tpot_s is None or decode_s <= 0:
            return None
        return self.output_tokens / decode_s

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens / total time, prefill included."""
        return self.output_tokens / self.total_s if self.total_s > 0 else None


@dataclass(frozen=True)
class TopLogprob:
    """One likely token: its text (bytes decoded as UTF-8, U+FFFD where a token holds part of a character), its raw
    bytes, and its log-probability."""

    token: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob(TopLogprob):
    """A generated token and, when ``top_logprobs`` asked for them, the most likely alternatives at its step."""

    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """What one streamed response adds to sequence ``index``: its text and, when asked, its tokens' log-probs (the
    tokens whose bytes make up ``text``). ``finish_reason`` is set on the sequence's last chunk."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None


@dataclass(frozen=True)
class Completion:
    """One generated sequence. ``index``: which of the request's ``n`` sequences. ``logprobs`` (``None`` unless
    asked): one entry per generated token, in order; ``cum_log_prob``: their sum as the server reports it."""

    text: str
    finish_reason: str  # "length" | "stop" | "cancelled"
    num_input_tokens: int
    num_output_tokens: int
    timings: Timings
    request_id: str
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    cum_log_prob: float | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV the server took from its prefix cache


@dataclass(frozen=True)
class Health:
    live: bool
    ready: bool
    model_ready: bool

    @property
    def ok(self) -> bool:
        return self.live and self.ready and self.model_ready


# Optional scalar inputs: SamplingParams field → (tensor name, numpy dtype).
_SCALARS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", np.float32),
    "top_k": ("top_k", np.int32),
    "top_p": ("top_p", np.float32),
    "seed": ("seed", np.uint64),
    "min_tokens": ("min_tokens", np.int32),
    "end_id": ("end_id", np.int32),
    "pad_id": ("pad_id", np.int32),
    "repetition_penalty": ("repetition_penalty", np.float32),
    "presence_penalty": ("presence_penalty", np.float32),
    "frequency_penalty": ("frequency_penalty", np.float32),
    "min_p": ("min_p", np.float32),
    "n": ("num_return_sequences", np.int32),
    "logprobs": ("return_log_probs", np.bool_),
    "top_logprobs": ("top_logprobs", np.int32),
}
_WORD_LISTS = {"stop": "stop_words", "bad_words": "bad_words"}


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _scalar_input(name: str, value: float | int | bool, dtype: type) -> grpcclient.InferInput:
    if np.issubdtype(dtype, np.integer):
        # numpy 1.x silently wraps out-of-range ints: the server would then reject a value nobody sent.
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{name}={value} is out of range for {np.dtype(dtype).name}")
    array = np.array([[value]], dtype=dtype)
    return _tensor(name, array, np_to_triton_dtype(array.dtype))


def _words_input(name: str, words: list[str]) -> grpcclient.InferInput:
    return _tensor(name, np.array([[w.encode("utf-8") for w in words]], dtype=object), "BYTES")


#: One chat message as the OpenAI chat API has it: ``{"role": "system" | "user" | "assistant" | "tool",
#: "content": str}``, an assistant's ``tool_calls`` and a tool result's ``tool_call_id`` included.
Message = Mapping[str, Any]


def one_sequence(params: SamplingParams | None, plural: str) -> SamplingParams | None:
    """``params`` for a call that returns one sequence; ``n`` > 1 is refused, naming the call that takes it."""
    if params is not None and params.sequences != 1:
        raise ValueError(f"n={params.n} asks for {params.n} sequences: call {plural}, which returns them all")
    return params


def messages_json(messages: Sequence[Message]) -> str:
    """The ensemble's ``messages`` input: the conversation as one JSON array (the server validates it)."""
    if isinstance(messages, (str, bytes, Mapping)):
        raise ValueError('messages must be a list of {"role": ..., "content": ...} dicts')
    try:
        return json.dumps([dict(m) for m in messages], ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"messages must be a list of {{role, content}} dicts: {exc}") from None


def build_inputs(prompt: str, params: SamplingParams, stream: bool) -> list[grpcclient.InferInput]:
    """The ensemble's input tensors for one prompt; optional inputs only when ``params`` sets them."""
    return _request_inputs(_words_input("text_input", [prompt]), params, stream)


def build_chat_inputs(messages: Sequence[Message], params: SamplingParams, stream: bool,
                      tools: Sequence[Mapping] | None = None,
                      chat_template_kwargs: Mapping[str, Any] | None = None) -> list[grpcclient.InferInput]:
    """The ensemble's input tensors for one chat: the server applies the model's chat template, with OpenAI's chat
    ``tools`` (``[{"type": "function", "function": {...}}]``) and the template's own variables when given."""
    inputs = _request_inputs(_words_input("messages", [messages_json(messages)]), params, stream)
    if tools:
        inputs.append(_words_input("tools", [json.dumps(list(tools), ensure_ascii=False)]))
    if chat_template_kwargs:
        inputs.append(_words_input("chat_template_kwargs", [json.dumps(dict(chat_template_kwargs))]))
    return inputs


def _request_inputs(what: grpcclient.InferInput, params: SamplingParams, stream: bool) -> list[grpcclient.InferInput]:
    inputs = [
        what,
        _scalar_input("max_tokens", params.max_tokens, np.int32),
        _scalar_input("stream", stream, np.bool_),
        _scalar_input("exclude_input_in_output", params.exclude_input_in_output, np.bool_),
    ]
    for attr, (name, dtype) in _SCALARS.items():
        value = getattr(params, attr)
        if value is not None:
            inputs.append(_scalar_input(name, value, dtype))
    for attr, name in _WORD_LISTS.items():
        words = getattr(params, attr)
        if words:
            inputs.append(_words_input(name, list(words)))
    if params.guide is not None:
        inputs.append(_words_input("guided_decoding_guide_type", [params.guide.type]))
        if params.guide.guide:
            inputs.append(_words_input("guided_decoding_guide", [params.guide.guide]))
    if params.logit_bias:
        inputs.append(_tensor("embedding_bias_token_ids", np.array([list(params.logit_bias)], dtype=np.int32), "INT32"))
        inputs.append(_tensor("embedding_bias_weights", np.array([list(params.logit_bias.values())], dtype=np.float32),
                              "FP32"))
    return inputs


def stop_inputs() -> list[grpcclient.InferInput]:
    """TensorRT-LLM's ``stop`` request for the LLM model: ends the running request with the same request
    id. The required inputs carry placeholders; the model looks only at ``stop`` and the id.

    Needed because Triton (2.51) cancels an ensemble only between steps: the LLM step already running
    would otherwise generate to ``max_tokens`` after the client has gone.
    """
    return [
        _tensor("input_ids", np.zeros((1, 1), dtype=np.int32), "INT32"),
        _tensor("input_lengths", np.ones((1, 1), dtype=np.int32), "INT32"),
        _tensor("request_output_len", np.ones((1, 1), dtype=np.int32), "INT32"),
        _scalar_input("stop", True, np.bool_),
    ]


def is_final(result: grpcclient.InferResult) -> bool:
    """Decoupled models flag their last response per request; with ``enable_empty_final_response`` the
    flag also arrives when the last response carries no data."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def _first(result: grpcclient.InferResult, name: str):
    array = result.as_numpy(name)
    return None if array is None or array.size == 0 else array.reshape(-1)[0]


def to_error(exc: Exception, url: str) -> GenerationError:
    """Map tritonclient / gRPC failures to ``GenerationError``. Errors sent over the stream by the server
    have no status code; transport failures carry UNAVAILABLE."""
    if isinstance(exc, grpc.RpcError):  # the asyncio stream raises raw gRPC errors
        code, message = exc.code(), exc.details()
    elif isinstance(exc, InferenceServerException):
        code, message = exc.status(), exc.message()
    else:
        code, message = None, str(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, str(grpc.StatusCode.UNAVAILABLE)):
        return ServerUnavailableError(url, message)
    return GenerationError(message or str(exc))


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _logprob(value) -> float:
    """-inf (a token the sampler could not pick) stays -inf; JSON writers map it (OpenAI uses -9999)."""
    value = float(value)
    return value if not math.isnan(value) else -math.inf


def token_logprobs(result: grpcclient.InferResult) -> tuple[TokenLogprob, ...]:
    """The tokens one response emits with their log-probs and alternatives (empty when none were asked for)."""
    values = result.as_numpy("output_log_probs")
    if values is None or values.size == 0:
        return ()
    values = values.reshape(-1)
    count = values.size
    raw = result.as_numpy("output_token_bytes")
    raw = [b""] * count if raw is None else raw.reshape(-1).tolist()
    top_bytes, top_values = result.as_numpy("top_logprob_bytes"), result.as_numpy("top_logprob_values")
    if top_bytes is None or top_values is None or top_values.size == 0:
        tops = [()] * count
    else:  # [1, n_tokens, K]: K alternatives per token, most likely first
        top_bytes = top_bytes.reshape(count, -1).tolist()
        top_values = top_values.reshape(count, -1)
        tops = [tuple(TopLogprob(_decode(b), b, _logprob(v)) for b, v in zip(row_bytes, row_values))
                for row_bytes, row_values in zip(top_bytes, top_values)]
    return tuple(TokenLogprob(_decode(b), b, _logprob(v), top) for b, v, top in zip(raw, values, tops))


class _SequenceState:
    """What one of the request's sequences has received so far."""

    def __init__(self):
        # Text goes through an incremental UTF-8 decoder so a character split across chunks is never garbled.
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []
        self.text_times: list[float] = []
        self.tokens: list[TokenLogprob] = []
        self.finish_reason = ""
        self.num_output_tokens = 0
        self.cum_log_prob: float | None = None


class ResponseCollector:
    """Accumulates the responses of one request into chunks and, at the final response, one Completion per sequence.

    With ``n`` > 1 the server tags each response with ``sequence_index``; the sequences' responses interleave.
    """

    def __init__(self, request_id: str, params: SamplingParams | None = None):
        params = params or SamplingParams()
        self.request_id = request_id
        self.completions: list[Completion] | None = None
        self._logprobs = params.wants_logprobs
        self._sequences = {i: _SequenceState() for i in range(params.sequences)}
        self._num_input_tokens = 0
        self._num_cached_tokens = 0
        self._start = 0.0
        self.sent = False

    @property
    def completion(self) -> Completion | None:
        """The first (with ``n`` = 1 the only) sequence, once the final response has arrived."""
        return self.completions[0] if self.completions else None

    def mark_sent(self) -> None:
        """Timings start here: a stream's request is sent when iteration starts, not when it is created."""
        self.sent = True
        self._start = time.perf_counter()

    def add(self, result: grpcclient.InferResult) -> Chunk | None:
        """Take one response; return what it adds to its sequence (None when it adds nothing)."""
        now = time.perf_counter()
        final = is_final(result)
        num_input = _first(result, "num_input_tokens")
        if num_input is not None:
            self._num_input_tokens = int(num_input)
        num_cached = _first(result, "num_cached_tokens")
        if num_cached is not None:
            self._num_cached_tokens = int(num_cached)
        index = _first(result, "sequence_index")
        index = 0 if index is None else int(index)
        seq = self._sequences.setdefault(index, _SequenceState())
        reason = _first(result, "finish_reason")
        reason = reason.decode("utf-8") if reason else None  # empty until the sequence's last response
        if reason:
            seq.finish_reason = reason
        delta = seq.decoder.decode(_first(result, "text_output") or b"", final=final or reason is not None)
        if delta:
            seq.parts.append(delta)
            seq.text_times.append(now)
        num_output = _first(result, "num_output_tokens")
        if num_output is not None:
            seq.num_output_tokens = int(num_output)
        tokens = token_logprobs(result)
        seq.tokens += tokens
        cum = _first(result, "cum_log_probs")
        if cum is not None:
            seq.cum_log_prob = float(cum)
        if final:
            self._finish(now)
        if delta or tokens or reason:
            return Chunk(index=index, text=delta, logprobs=tokens, finish_reason=reason)
        return None

    def _finish(self, now: float) -> None:
        self.completions = []
        for index, seq in sorted(self._sequences.items()):
            self.completions.append(Completion(
                text="".join(seq.parts), finish_reason=seq.finish_reason,
                num_input_tokens=self._num_input_tokens, num_output_tokens=seq.num_output_tokens,
                timings=Timings.measure(self._start, seq.text_times, now, seq.num_output_tokens),
                request_id=self.request_id, index=index,
                logprobs=tuple(seq.tokens) if self._logprobs else None, cum_log_prob=seq.cum_log_prob,
                num_cached_tokens=self._num_cached_tokens))
