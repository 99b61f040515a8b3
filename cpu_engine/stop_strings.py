"""Stop words matched on text, not tokens: a stop string ends a sequence even when the model produces it with other
tokens than the string alone tokenises to, and even when it ends inside a token (README, "Stop words"). Used by the
CPU engine and by the GPU layout's executor engine (serving/executor_engine.py), whose TensorRT-LLM matches token ids
only."""

from __future__ import annotations


class StopStrings:
    """One sequence's stop strings (as UTF-8 bytes) and the tail of its output that a match may span."""

    def __init__(self, words: list[bytes]):
        self.words = [w for w in words if w]
        self._keep = max((len(w) for w in self.words), default=1) - 1
        self._tail = b""

    @classmethod
    def of(cls, token_bytes: list[bytes], words: list[list[int]]) -> StopStrings:
        """From stop words given as token ids (TensorRT-LLM's ``stop_words_list``)."""
        return cls([b"".join(token_bytes[i] for i in w) for w in words])

    def fresh(self) -> StopStrings:
        """The same words with nothing seen yet (another sequence of the same request)."""
        return StopStrings(self.words)

    def hit(self, new: bytes) -> bool:
        """Whether the output, now ending with ``new``, ends a stop string somewhere inside ``new``."""
        if not self.words:
            return False
        window = self._tail + new
        hit = any(w in window[-(len(w) + len(new) - 1):] for w in self.words)
        self._tail = window[-self._keep:] if self._keep > 0 else b""
        return hit
