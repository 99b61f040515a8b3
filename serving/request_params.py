"""Validation and defaults for request parameters, shared by preprocessing and the LLM model.

Errors are ``ValueError`` with a message a person understands; the Triton models turn them into
INVALID_ARG. No torch here: the text stages stay light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    if not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be between 0 and max_tokens ({max_tokens}), got {min_tokens}")
