"""Helpers for the Python-backend models (importable only inside Triton's Python stub)."""

from __future__ import annotations

import json
from collections.abc import Collection

import numpy as np
import triton_python_backend_utils as pb_utils

from serving.drain import SHUTTING_DOWN
from serving.sequence_output import Chunk
from serving.text import decode_ids


class RequestError(ValueError):
    """A request the user must fix: becomes INVALID_ARG."""


def model_parameters(args: dict) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def tensor(request, name: str) -> np.ndarray | None:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def single_row(request, name: str) -> np.ndarray | None:
    """The request's only batch row of ``name``; one prompt per request, like TensorRT-LLM's in-flight batcher."""
    value = tensor(request, name)
    if value is None:
        return None
    if value.ndim == 0 or value.shape[0] != 1:
        raise RequestError(f"send one prompt per request: {name} has batch size "
                           f"{value.shape[0] if value.ndim else 0}, expected 1")
    return value[0]


def scalar(request, name: str, cast):
    """An optional [1, 1] input as a Python value, or None when absent."""
    row = single_row(request, name)
    if row is None:
        return None
    if row.size != 1:
        raise RequestError(f"{name} must hold exactly one value, got {row.size}")
    return cast(row.reshape(-1)[0])


def error_response(exc: Exception, code=None) -> "pb_utils.InferenceResponse":
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc), code))


def shutting_down_response() -> "pb_utils.InferenceResponse":
    """A new request during a drain: UNAVAILABLE, so clients and load balancers retry elsewhere."""
    return pb_utils.InferenceResponse(output_tensors=[],
                                      error=pb_utils.TritonError(SHUTTING_DOWN, pb_utils.TritonError.UNAVAILABLE))


# Sent only to a request that asked for log-probs, as tensorrtllm_backend sends them only when its executor returned
# some: otherwise five empty tensors on every response were built here, copied through Triton and parsed by the client.
LOGPROB_OUTPUTS = frozenset({"output_log_probs", "cum_log_probs", "output_token_bytes", "top_logprob_bytes",
                             "top_logprob_values"})


def llm_response(table: list[bytes], chunk: Chunk, outputs: Collection[str]) -> "pb_utils.InferenceResponse":
    """One response of the ``llm`` model (CPU engine and GPU wrapper alike): TensorRT-LLM's ``output_ids`` and
    ``sequence_length``, the text of those ids, the finish reason, the token counts, the log-probs of the
    generated tokens it carries with their bytes and alternatives, and ``sequence_index`` — only the ``outputs``
    the request asked for (the ensemble asks for all but the ids; the model leaves out ``LOGPROB_OUTPUTS`` when
    the request asked for no log-probs).

    The text is made here, by the one thread that answers the request in order, and not by a
    postprocessing model after it: Triton runs the responses of one stream on several postprocessing
    instances at once and forwards whichever finishes first, so a streamed answer could come back scrambled
    (seen on the first request after start; tensorrtllm_backend#614). ``chunk.ids`` end on a complete UTF-8
    character (serving/sequence_output.py), so each chunk decodes on its own.
    """
    ids, lps = chunk.ids, chunk.logprobs
    token = lambda i: table[i] if 0 <= i < len(table) else b""  # noqa: E731 - padding rows past the tokenizer
    generated = ids[len(ids) - len(lps):]  # the tokens the log-probs belong to (never the echoed prompt)
    k = max((len(lp.top) for lp in lps), default=0)
    values = {
        "output_ids": lambda: np.array(ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": lambda: np.array([[len(ids)]], dtype=np.int32),
        "text_output": lambda: np.array([[decode_ids(table, ids).encode("utf-8")]], dtype=object),
        "finish_reason": lambda: np.array([[chunk.finish_reason.encode()]], dtype=object),
        "num_input_tokens": lambda: np.array([[chunk.num_input_tokens]], dtype=np.int32),
        "num_output_tokens": lambda: np.array([[chunk.num_output_tokens]], dtype=np.int32),
        "num_cached_tokens": lambda: np.array([[chunk.num_cached_tokens]], dtype=np.int32),
        "output_log_probs": lambda: np.array([lp.logprob for lp in lps], dtype=np.float32).reshape(1, 1, -1),
        "cum_log_probs": lambda: np.array([[chunk.cum_logprob]], dtype=np.float32),
        "output_token_bytes": lambda: np.array([token(i) for i in generated], dtype=object).reshape(1, -1),
        "top_logprob_bytes": lambda: np.array([[token(t) for t, _ in lp.top] for lp in lps],
                                              dtype=object).reshape(1, len(lps), k),
        "top_logprob_values": lambda: np.array([[v for _, v in lp.top] for lp in lps],
                                               dtype=np.float32).reshape(1, len(lps), k),
        "sequence_index": lambda: np.array([[chunk.sequence_index]], dtype=np.int32),
    }
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, make()) for name, make in values.items()
                                                      if name in outputs])
