"""One generated sequence turned into the ``llm`` model's responses (the CPU llm and the GPU wrapper alike).

Tokens arrive from the engine (CPU) or from ``tensorrt_llm`` (GPU: each response holds the new tokens); this cuts
them into chunks only at complete UTF-8 characters, counts ``num_output_tokens``, puts the echoed prompt in front
of the first chunk, and keeps each token's log-prob and alternatives next to it, so a chunk's ``logprobs`` cover
exactly the generated tokens whose text it carries (the OpenAI front door relies on that alignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.text import Utf8Chunker


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-prob under the model, and the ``top`` alternatives (token id, log-prob), best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Chunk:
    ids: list[int]  # the echoed prompt (first chunk only), then generated tokens
    num_input_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    finish_reason: str = ""  # "" on every response but the sequence's last one
    final: bool = False
    sequence_index: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated id in ``ids`` (asked for only)
    cum_logprob: float = 0.0


@dataclass
class SequenceOutput:
    table: list[bytes]
    streaming: bool
    max_tokens: int
    num_input_tokens: int
    echo_ids: list[int] = field(default_factory=list)  # the prompt, when exclude_input_in_output is false
    sequence_index: int = 0
    generated: int = 0
    cum_logprob: float = 0.0
    num_cached_tokens: int = 0  # the engine says with the first token
    _held: list[int] = field(default_factory=list)  # generated ids not sent yet
    _held_logprobs: list[TokenLogprob] = field(default_factory=list)
    _chunker: Utf8Chunker | None = None

    def __post_init__(self) -> None:
        self._chunker = Utf8Chunker(self.table)

    def add(self, new_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> None:
        """New tokens, and their log-probs when the request asked for them."""
        self.generated += len(new_ids)
        if logprobs:
            self._held_logprobs += logprobs
            self.cum_logprob += sum(lp.logprob for lp in logprobs)
        if not self.streaming:
            self._held += new_ids
            return
        for token in new_ids:
            self._held += self._chunker.push(int(token)) or []

    def ready(self) -> Chunk | None:
        """Streaming: the chunk that can go now (complete characters, or the echo), or None."""
        if not self.streaming or (not self._held and not self.echo_ids):
            return None
        return self._chunk(self._take(len(self._held)))

    def push(self, new_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> Chunk | None:
        """``add`` then ``ready``: one backend response's tokens → a chunk to send now, or None."""
        self.add(new_ids, logprobs)
        return self.ready()

    def finish(self, reason: str) -> Chunk:
        """The sequence's last response: whatever is held back, and the finish reason."""
        if self.streaming:
            self._held += self._chunker.flush()
        chunk = self._chunk(self._take(len(self._held)))
        chunk.finish_reason, chunk.final = reason, True
        return chunk

    def reason_without_engine(self, cancelled: bool) -> str:
        """The finish reason when the backend does not say (tensorrt_llm): ``request_output_len`` tokens mean
        ``length``, fewer mean the end id or a stop word ended it."""
        if cancelled:
            return "cancelled"
        return "length" if self.generated >= self.max_tokens else "stop"

    def _take(self, n: int) -> tuple[list[int], list[TokenLogprob]]:
        ids, self._held = self._held[:n], self._held[n:]
        # Tokens whose log-probs were not asked for have none; those that were keep their order with the ids.
        logprobs, self._held_logprobs = self._held_logprobs[:n], self._held_logprobs[n:]
        return ids, logprobs

    def _chunk(self, taken: tuple[list[int], list[TokenLogprob]]) -> Chunk:
        ids, logprobs = taken
        if self.echo_ids:
            ids, self.echo_ids = self.echo_ids + ids, []
        return Chunk(ids, self.num_input_tokens, self.generated, self.num_cached_tokens, sequence_index=self.sequence_index,
                     logprobs=logprobs, cum_logprob=self.cum_logprob)
