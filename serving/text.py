"""Token ids <-> text without the anchors' streaming bugs.

Text is defined as the UTF-8 decoding of the concatenated *bytes* of the tokens, never as a per-chunk
``tokenizer.decode`` (which strips the leading space of a chunk and turns a character split across tokens
into U+FFFD). The same table serves streaming and non-streaming, so the streamed chunks concatenate to
the non-streamed text byte for byte.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (inverse of tokenizers' ByteLevel mapping)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kinds(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {kind for d in decoder.get("decoders", []) for kind in _decoder_kinds(d)}
    return {decoder.get("type", "")}


def token_bytes_table(tokenizer_dir: str | Path) -> list[bytes]:
    """Bytes of every token id, read from ``tokenizer.json``. Special tokens map to b"" (skipped in text).

    Supports the two families Llama checkpoints use: byte-level BPE (Llama 3, GPT-2 style, ours) and
    SentencePiece-style ``▁`` + ``<0xNN>`` byte fallback (Llama 2, Mistral).
    """
    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    for t in spec.get("added_tokens", []):
        vocab.setdefault(t["content"], t["id"])
    kinds = _decoder_kinds(spec.get("decoder"))
    table = [b""] * (max(vocab.values()) + 1)
    if "ByteLevel" in kinds:
        alphabet = _byte_level_alphabet()
        for piece, idx in vocab.items():
            if idx in special:
                continue
            if all(ch in alphabet for ch in piece):
                table[idx] = bytes(alphabet[ch] for ch in piece)
            else:  # an added non-special token stored as plain text
                table[idx] = piece.encode("utf-8")
    elif kinds & {"Metaspace", "Replace", "ByteFallback"}:
        for piece, idx in vocab.items():
            if idx in special:
                continue
            match = _BYTE_FALLBACK.match(piece)
            table[idx] = bytes([int(match.group(1), 16)]) if match else piece.replace("▁", " ").encode("utf-8")
    else:
        raise ValueError(f"unsupported tokenizer decoder {sorted(kinds)} in {tokenizer_dir}/tokenizer.json: "
                         "expected byte-level BPE or SentencePiece-style byte fallback")
    return table


def decode_ids(table: list[bytes], ids) -> str:
    """Text of a token sequence; invalid UTF-8 (possible from an untrained model) becomes U+FFFD."""
    return b"".join(table[i] for i in ids if 0 <= i < len(table)).decode("utf-8", errors="replace")


@dataclass
class Utf8Chunker:
    """Decides where a token stream may be cut into text chunks.

    A chunk ends only where the incremental UTF-8 decoder holds no partial character, so decoding each
    chunk on its own gives exactly the text of decoding the whole stream at once.
    """

    table: list[bytes]
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    _pending: list[int] = field(default_factory=list)

    def push(self, token_id: int) -> list[int] | None:
        """Add a token; return the ids of a complete chunk, or None while a character is still open."""
        self._pending.append(token_id)
        self._decoder.decode(self.table[token_id] if 0 <= token_id < len(self.table) else b"")
        if self._decoder.getstate()[0]:
            return None
        chunk, self._pending = self._pending, []
        return chunk

    def flush(self) -> list[int]:
        chunk, self._pending = self._pending, []
        self._decoder.reset()
        return chunk


def to_word_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's word-list format: int32 [2, N] = flat ids and their end offsets, padded with 0 / -1."""
    flat = [i for w in words for i in w]
    offsets = np.cumsum([len(w) for w in words]).tolist()
    width = max(len(flat), len(offsets), 1)
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def from_word_list(word_list: np.ndarray | None) -> list[list[int]]:
    """Inverse of :func:`to_word_list` for one request ([2, N])."""
    if word_list is None or word_list.size == 0:
        return []
    flat, offsets = word_list[0].tolist(), [o for o in word_list[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > len(flat) or end < start:
            raise ValueError(f"malformed word list: offset {end} after {start} with {len(flat)} ids")
        if end > start:
            words.append(flat[start:end])
        start = end
    return words
