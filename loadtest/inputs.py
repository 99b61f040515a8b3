"""Request populations for perf_analyzer's ``--input-data`` JSON, with exact prompt token counts.

Prompts are cut from local text (the Python standard library's sources: what the default model was trained
on, present on every machine, no download) with the model's own tokenizer, so that a prompt of "128 tokens"
is 128 tokens *as the server counts them* (``tokenizer.encode(prompt)``, special tokens included).
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .spec import Inputs, TokenDist


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int
    output_tokens: int


class PromptTokenizer:
    """The model's tokenizer (``tokenizer.json`` via ``tokenizers``: fast, offline, no transformers import).

    ``count`` equals what preprocessing sees: ``AutoTokenizer.encode(prompt)`` with special tokens."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: --tokenizer must be a local model/tokenizer directory")
        self.dir = Path(tokenizer_dir)
        self._tok = Tokenizer.from_file(str(path))
        self.special = len(self._tok.encode("x").ids) - len(self._tok.encode("x", add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)

    def ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


@lru_cache(maxsize=1)
def corpus_text(max_chars: int = 2_000_000) -> str:
    """Top-level standard-library sources, concatenated in a fixed order (deterministic)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text)
        if size >= max_chars:
            break
    if not parts:  # a Python without its sources: still deterministic, still text
        parts = [f"def function_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(20000)]
    return "".join(parts)


def sample_length(dist: TokenDist, rng: random.Random) -> int:
    value = dist.mean if dist.stddev == 0 else round(rng.gauss(dist.mean, dist.stddev))
    return int(min(dist.high, max(dist.low, value)))


def prompt_with_tokens(tok: PromptTokenizer, target: int, rng: random.Random, corpus: str | None = None,
                       attempts: int = 50) -> str:
    """A text that ``tok.count`` measures as exactly ``target`` tokens (special tokens included)."""
    corpus = corpus if corpus is not None else corpus_text()
    want = target - tok.special
    if want < 1:
        raise ValueError(f"a prompt needs at least {tok.special + 1} tokens with this tokenizer")
    for _ in range(attempts):
        start = rng.randrange(0, max(1, len(corpus) - 8 * (want + 16)))
        ids = tok.ids(corpus[start:start + 8 * (want + 16) + 64])
        if len(ids) < want + 8:
            continue
        # Decoding then re-encoding can merge or split at the edges: nudge the cut until the count is exact.
        n = want
        for _ in range(8):
            text = tok.decode(ids[:n])
            if not text.strip():
                break
            got = tok.count(text)
            if got == target:
                return text
            n += target - got
            if not 1 <= n <= len(ids):
                break
    raise RuntimeError(f"could not cut a prompt of exactly {target} tokens from the corpus")


def generate_requests(spec: Inputs, tokenizer: PromptTokenizer, corpus: str | None = None) -> list[Request]:
    rng = random.Random(spec.seed)
    kinds = spec.kinds()
    weights = [k.weight for k in kinds]
    requests = []
    for _ in range(spec.num_prompts):
        kind = rng.choices(kinds, weights)[0] if len(kinds) > 1 else kinds[0]
        n_in = sample_length(kind.prompt_tokens, rng)
        n_out = sample_length(kind.output_tokens, rng)
        requests.append(Request(prompt_with_tokens(tokenizer, n_in, rng, corpus), n_in, n_out))
    return requests


def perf_analyzer_data(requests: list[Request], *, streaming: bool, exact_output: bool = True,
                       temperature: float | None = None) -> dict:
    """perf_analyzer ``--input-data`` JSON for the ensemble (each tensor has shape [1])."""
    data = []
    for r in requests:
        entry: dict = {"text_input": [r.prompt], "max_tokens": [r.output_tokens], "stream": [streaming]}
        if exact_output:
            entry["min_tokens"] = [r.output_tokens]
        if temperature is not None:
            entry["temperature"] = [float(temperature)]
        data.append(entry)
    return {"data": data}


def write_input_data(spec: Inputs, tokenizer_dir: str | Path, out: str | Path, *, streaming: bool) -> list[Request]:
    tok = PromptTokenizer(tokenizer_dir)
    requests = generate_requests(spec, tok)
    payload = perf_analyzer_data(requests, streaming=streaming, exact_output=spec.exact_output,
                                 temperature=spec.temperature)
    Path(out).write_text(json.dumps(payload, ensure_ascii=False, indent=1) + "\n", "utf-8")
    return requests


def describe(requests: list[Request]) -> dict:
    ins = [r.prompt_tokens for r in requests]
    outs = [r.output_tokens for r in requests]
    return {"count": len(requests), "prompt_tokens_mean": sum(ins) / len(ins), "prompt_tokens_min": min(ins),
            "prompt_tokens_max": max(ins), "output_tokens_mean": sum(outs) / len(outs),
            "output_tokens_min": min(outs), "output_tokens_max": max(outs)}
