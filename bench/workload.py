"""What every benchmark here sends and how it summarises: prompts from the held-out English text, percentiles."""

from __future__ import annotations

from pathlib import Path


def make_prompts(checkpoint: Path, prompt_tokens: int, count: int) -> tuple[list[str], list[list[int]]]:
    """``count`` distinct English prompts of ~prompt_tokens tokens from the held-out local English text
    (``builders/english_text.py``): consecutive slices of its token stream, each decoded and re-encoded."""
    from transformers import AutoTokenizer

    from builders.english_text import evaluation_texts, token_stream

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    texts, ids = [], []
    stream = token_stream(tok, evaluation_texts())
    for start in range(0, len(stream) - prompt_tokens, prompt_tokens):
        text = tok.decode(stream[start + 1:start + prompt_tokens], skip_special_tokens=True)
        if not text.strip():
            continue
        texts.append(text)
        ids.append(tok.encode(text))
        if len(texts) == count:
            break
    return texts, ids


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
