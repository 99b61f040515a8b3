"""Validation and defaults for request parameters, shared by preprocessing and the LLM model.

Errors are ``ValueError`` with a message a person understands; the Triton models turn them into
INVALID_ARG. No torch here (numpy only): the text stages stay light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """TensorRT-LLM's runtime semantics: ``top_k == 1`` is greedy, ``top_k == 0`` disables the cut."""

    temperature: float = 1.0
    top_k: int = 1
    top_p: float = 1.0


GREEDY = Sampling()


def resolve_sampling(temperature: float | None, top_k: int | None, top_p: float | None) -> Sampling:
    """Greedy unless the request asks for sampling; temperature 0 also means greedy."""
    if temperature is not None and (math.isnan(temperature) or math.isinf(temperature) or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables top-k), got {top_k}")
    if top_p is not None and (math.isnan(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature is None and top_k is None and top_p is None:
        return GREEDY
    if temperature == 0.0:
        return GREEDY
    return Sampling(temperature=1.0 if temperature is None else float(temperature),
                    top_k=0 if top_k is None else int(top_k),
                    top_p=1.0 if top_p is None else float(top_p))


def check_lengths(input_len: int, max_tokens: int, max_input_len: int, max_seq_len: int, what: str = "prompt") -> None:
    """``what``: how the error names the input ("prompt", or a conversation after its chat template)."""
    if input_len > max_input_len:
        raise ValueError(f"{what} is {input_len} tokens long; this engine accepts at most {max_input_len} "
                         "input tokens (max_input_len)")
    limit = max_seq_len - input_len
    if not 1 <= max_tokens <= limit:
        raise ValueError(f"max_tokens must be between 1 and {limit} for this {input_len}-token prompt "
                         f"(engine max_seq_len {max_seq_len}), got {max_tokens}")


def resolve_end_id(end_id: int | None, vocab_size: int) -> int | None:
    """``end_id`` as the engine takes it: -1 is TensorRT-LLM's "no end id"; any other id must be a token."""
    if end_id is None or end_id == -1:
        return None
    if not 0 <= end_id < vocab_size:
        raise ValueError(f"end_id must be a token id in [0, {vocab_size}) or -1 (none), got {end_id}")
    return end_id


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    if not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be between 0 and max_tokens ({max_tokens}), got {min_tokens}")


def embedding_bias(token_ids, weights, vocab_size: int) -> np.ndarray:
    """TensorRT-LLM's ``embedding_bias`` ([1, vocab_size] FP32, added to the logits before sampling; [1, 0]: none)
    from ``embedding_bias_token_ids`` and ``embedding_bias_weights`` (OpenAI's ``logit_bias``: token id → bias; a
    repeated id adds up). Sized by the engine's vocabulary, not the tokenizer's (tensorrtllm_backend's preprocessing
    uses ``tokenizer.vocab_size``, which leaves out added tokens)."""
    if token_ids is None and weights is None:
        return np.empty((1, 0), dtype=np.float32)
    if token_ids is None or weights is None:
        missing = "embedding_bias_weights" if weights is None else "embedding_bias_token_ids"
        raise ValueError(f"embedding_bias_token_ids and embedding_bias_weights go together: {missing} is missing")
    ids, values = np.asarray(token_ids).reshape(-1), np.asarray(weights, dtype=np.float32).reshape(-1)
    if ids.size != values.size:
        raise ValueError(f"embedding_bias_token_ids ({ids.size}) and embedding_bias_weights ({values.size}) must have "
                         "the same length")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"embedding_bias_token_ids must be token ids in [0, {vocab_size}), got min {ids.min()} max "
                         f"{ids.max()}")
    if not np.isfinite(values).all():
        raise ValueError("embedding_bias_weights must be finite numbers")
    bias = np.zeros((1, vocab_size), dtype=np.float32)
    np.add.at(bias[0], ids.astype(np.int64), values)
    return bias


def check_embedding_bias(bias: np.ndarray | None, vocab_size: int) -> np.ndarray | None:
    """The llm's ``embedding_bias`` row as one bias per vocabulary entry, or None (absent or empty)."""
    if bias is None or bias.size == 0:
        return None
    bias = bias.reshape(-1)
    if bias.size != vocab_size:
        raise ValueError(f"embedding_bias must hold one value per vocabulary entry ({vocab_size}), got {bias.size}")
    if not np.isfinite(bias).all():
        raise ValueError("embedding_bias must be finite numbers")
    return bias.astype(np.float32, copy=False)


# ---- issue 17's request controls: TensorRT-LLM's input names (min_p and top_logprobs are ours) -------------------
# TensorRT-LLM's guided_decoding_guide_type values (GuideType JSON, JSON_SCHEMA, REGEX, EBNF_GRAMMAR, STRUCTURAL_TAG)
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
# Also the OpenAI front door's limits (serving/openai/protocol.py) and the CPU engine's (cpu_engine/scheduler.py).
MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_SEQUENCES = 8


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Controls:
    """Penalties, min_p, log-probs, several sequences and guided decoding of one request; defaults change nothing."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    return_log_probs: bool = False
    top_logprobs: int = 0
    num_return_sequences: int = 1
    guided_decoding_guide_type: str = ""
    guided_decoding_guide: str = ""


#: Each control's input name and how a tensor element becomes its value (the ensemble and the llm use the same names).
CONTROL_INPUTS: dict[str, type | object] = {
    "repetition_penalty": float, "presence_penalty": float, "frequency_penalty": float, "min_p": float,
    "return_log_probs": bool, "top_logprobs": int, "num_return_sequences": int,
    "guided_decoding_guide_type": _text, "guided_decoding_guide": _text,
}


def resolve_controls(values: dict[str, object]) -> Controls:
    """``values``: the inputs present (name → value; absent ones missing or None). Raises ValueError naming the input."""
    given = {name: value for name, value in values.items() if value is not None}
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p"):
        if name in given and not math.isfinite(given[name]):
            raise ValueError(f"{name} must be a finite number, got {given[name]}")
    c = Controls(**given)
    if c.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 means none), got {c.repetition_penalty}")
    if not 0.0 <= c.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {c.min_p}")
    if not 0 <= c.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {c.top_logprobs}")
    if not 1 <= c.num_return_sequences <= MAX_SEQUENCES:
        raise ValueError(f"num_return_sequences must be between 1 and {MAX_SEQUENCES}, got {c.num_return_sequences}")
    kind = c.guided_decoding_guide_type
    if kind and kind not in GUIDE_TYPES:
        raise ValueError(f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, got {kind!r}")
    if c.guided_decoding_guide and not kind:
        raise ValueError("guided_decoding_guide was sent without guided_decoding_guide_type")
    if kind in GUIDE_TYPES[1:] and not c.guided_decoding_guide.strip():
        raise ValueError(f"guided_decoding_guide_type {kind} needs the {kind} in guided_decoding_guide")
    if c.top_logprobs and not c.return_log_probs:  # asking for alternatives asks for log-probs
        c = Controls(**{**vars(c), "return_log_probs": True})
    return c
