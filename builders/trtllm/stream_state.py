"""Per-request state of the GPU ``llm`` wrapper (pure Python, tested on CPU).

The ``tensorrt_llm`` backend streams token ids (each response: the new tokens) and ends the stream without a
finish reason or counts. This turns that into the CPU ``llm`` contract: chunks cut only at complete UTF-8
characters, cumulative ``num_output_tokens``, ``num_input_tokens`` from the request, and on the final
response ``finish_reason`` = ``cancelled`` | ``length`` (``request_output_len`` tokens generated) | ``stop``
(end id or a stop word ended it earlier).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.text import Utf8Chunker


@dataclass
class Chunk:
    ids: list[int]
    num_input_tokens: int
    num_output_tokens: int
    finish_reason: str = ""  # "" on every response but the final one
    final: bool = False


@dataclass
class StreamState:
    table: list[bytes]
    streaming: bool
    max_tokens: int
    num_input_tokens: int
    echo_ids: list[int] = field(default_factory=list)  # the prompt, when exclude_input_in_output is false
    generated: int = 0
    _collected: list[int] = field(default_factory=list)
    _chunker: Utf8Chunker | None = None

    def __post_init__(self) -> None:
        self._chunker = Utf8Chunker(self.table)

    def _with_echo(self, ids: list[int]) -> list[int]:
        if self.echo_ids:
            ids, self.echo_ids = self.echo_ids + ids, []
        return ids

    def push(self, new_ids: list[int]) -> Chunk | None:
        """New tokens from one backend response → a chunk to send now (streaming), or None."""
        self.generated += len(new_ids)
        if not self.streaming:
            self._collected.extend(new_ids)
            return None
        ready: list[int] = []
        for token in new_ids:
            ready += self._chunker.push(int(token)) or []
        if not ready and not self.echo_ids:
            return None
        return Chunk(self._with_echo(ready), self.num_input_tokens, self.generated)

    def finish(self, cancelled: bool = False) -> Chunk:
        """The final response: whatever is held back, and the finish reason."""
        rest = self._chunker.flush() if self.streaming else self._collected
        if cancelled:
            reason = "cancelled"
        elif self.generated >= self.max_tokens:
            reason = "length"
        else:
            reason = "stop"
        return Chunk(self._with_echo(list(rest)), self.num_input_tokens, self.generated, reason, final=True)
