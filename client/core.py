"""What the sync and asyncio clients share: public types, request tensors, response parsing, timings.

The ensemble follows tensorrtllm_backend's text contract; it has ``max_batch_size > 0``, so every tensor
carries a leading batch dimension of 1.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass
class SamplingParams:
    """Per-request generation settings. ``None`` (or an empty word list) means "not sent": the server's
    default applies (greedy decoding unless temperature/top_k/top_p ask for sampling)."""

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
class Completion:
    text: str
    finish_reason: str  # "length" | "stop" | "cancelled"
    num_input_tokens: int
    num_output_tokens: int
    timings: Timings
    request_id: str


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


#: One chat message as the OpenAI chat API has it: ``{"role": "system" | "user" | "assistant", "content": str}``.
Message = Mapping[str, str]


def messages_json(messages: Sequence[Message]) -> str:
    """The ensemble's ``messages`` input: the conversation as one JSON array (the server validates it)."""
    if isinstance(messages, (str, bytes, Mapping)):
        raise ValueError('messages must be a list of {"role": ..., "content": ...} dicts')
    try:
        return json.dumps([dict(m) for m in messages], ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"messages must be a list of {{role, content}} dicts of strings: {exc}") from None


def build_inputs(prompt: str, params: SamplingParams, stream: bool) -> list[grpcclient.InferInput]:
    """The ensemble's input tensors for one prompt; optional inputs only when ``params`` sets them."""
    return _request_inputs(_words_input("text_input", [prompt]), params, stream)


def build_chat_inputs(messages: Sequence[Message], params: SamplingParams, stream: bool) -> list[grpcclient.InferInput]:
    """The ensemble's input tensors for one chat: the server applies the model's chat template."""
    return _request_inputs(_words_input("messages", [messages_json(messages)]), params, stream)


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


class ResponseCollector:
    """Accumulates the responses of one request into text deltas and, at the final response, a Completion.

    Text goes through an incremental UTF-8 decoder so a character split across chunks is never garbled.
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.completion: Completion | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self._text_times: list[float] = []
        self._finish_reason = ""
        self._num_input_tokens = 0
        self._num_output_tokens = 0
        self._start = 0.0
        self.sent = False

    def mark_sent(self) -> None:
        """Timings start here: a stream's request is sent when iteration starts, not when it is created."""
        self.sent = True
        self._start = time.perf_counter()

    def add(self, result: grpcclient.InferResult) -> str:
        """Take one response; return its text delta (possibly empty)."""
        now = time.perf_counter()
        final = is_final(result)
        delta = self._decoder.decode(_first(result, "text_output") or b"", final=final)
        if delta:
            self._parts.append(delta)
            self._text_times.append(now)
        reason = _first(result, "finish_reason")
        if reason:  # empty on non-final streamed chunks
            self._finish_reason = reason.decode("utf-8")
        num_input = _first(result, "num_input_tokens")
        if num_input is not None:
            self._num_input_tokens = int(num_input)
        num_output = _first(result, "num_output_tokens")
        if num_output is not None:
            self._num_output_tokens = int(num_output)
        if final:
            self.completion = Completion(
                text="".join(self._parts), finish_reason=self._finish_reason,
                num_input_tokens=self._num_input_tokens, num_output_tokens=self._num_output_tokens,
                timings=Timings.measure(self._start, self._text_times, now, self._num_output_tokens),
                request_id=self.request_id)
        return delta
