"""A Triton request as a task the HTTP side can abandon, and OpenAI's stop-string semantics.

Why a task of its own: Starlette cancels a streaming response through an anyio cancel scope, which cancels
again at every ``await`` inside it, so a generator's cleanup there could not send the llm its ``stop`` or read
the gRPC call to its end. The request runs in a plain asyncio task instead; abandoning it is ``task.cancel()``
(synchronous), and the client's own cleanup (client/aio.py: send ``stop``, read the call to its end in the
background rather than cancel it — a call cancelled mid-stream or dropped stalls Triton 2.51's shutdown,
docs/reliability.md B5 and cause D) starts in that task.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from client import AsyncTextStream, Chunk, Completion, TokenLogprob

T = TypeVar("T")
_END = object()


class Tasks:
    """Every Triton request in flight, so shutdown can wait for their cleanup before closing the channel."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def start(self, coro: Awaitable[T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_all(self, timeout_s: float) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


class Generation:
    """One streamed request: its chunks pumped from the gRPC stream into a queue by a task of its own."""

    def __init__(self, stream: AsyncTextStream, tasks: Tasks):
        self.stream = stream
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = tasks.start(self._pump())

    async def _pump(self) -> None:
        try:
            async for chunk in self.stream.chunks():
                self._queue.put_nowait(chunk)
            self._queue.put_nowait(_END)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who turns it into an HTTP error
            self._queue.put_nowait(exc)

    async def next(self) -> Chunk | None:
        """The next chunk (of any of the request's sequences); None at the end; raises the request's error."""
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # idempotent end
            return None
        if isinstance(item, Exception):
            raise item
        return item

    async def first(self, receive: Callable[[], Awaitable[dict]]) -> Chunk | None:
        """The first chunk, as ``next``; ``ClientGone`` when the HTTP client leaves before it. On either error the
        Triton request is abandoned."""
        try:
            return await unless_disconnected(asyncio.ensure_future(self.next()), receive)
        except BaseException:
            self.abandon()
            raise

    @property
    def completions(self) -> list[Completion] | None:
        return self.stream.completions

    def abandon(self) -> None:
        """The HTTP client has gone: cancel the Triton request (the pump task cleans up on its own)."""
        if not self._task.done():
            self._task.cancel()


async def until_disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the HTTP client disconnects (call after the request body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


async def unless_disconnected(work: asyncio.Future[T], receive: Callable[[], Awaitable[dict]]) -> T:
    """``work``'s result; raises ``ClientGone`` (and cancels ``work``) when the HTTP client disconnects first."""
    watcher = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work.done():
        return work.result()
    work.cancel()
    raise ClientGone()


class StopTrimmer:
    """OpenAI's stop strings: the text ends *before* the first stop string (the engine's output includes it,
    TensorRT-LLM's behaviour). Streaming holds back a tail that could be the start of a stop string, so the
    streamed deltas concatenate to exactly the non-streamed text."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Text that can be sent now."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        self._pending += delta
        cut = self._first_stop(self._pending)
        if cut is not None:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        hold = self._partial_tail(self._pending)
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def trim(self, text: str) -> str:
        """The whole text at once (non-streamed)."""
        return self.feed(text) + self.flush()

    def _first_stop(self, text: str) -> int | None:
        """Where the stop string that *completes* first begins: the one a streaming engine stops on."""
        hits = [(i + len(s), i) for s in self.stops if (i := text.find(s)) >= 0]
        return min(hits)[1] if hits else None

    def _partial_tail(self, text: str) -> int:
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest


class ChoiceText:
    """One choice's text and token log-probs as OpenAI returns them: the text cut before the first stop string
    (``StopTrimmer``), and each token's log-prob sent with the text chunk that carries the token's last character.
    When a stop string cuts the text, the tokens that began before the cut are kept and the rest dropped. Streamed
    chunks and the whole text (one ``feed``) give the same tokens, so streamed log-probs equal non-streamed ones.

    A token's characters are counted with an incremental UTF-8 decoder over the token bytes, the way the client
    decodes the text, so a token that holds part of a character goes out with the chunk that completes it.
    """

    def __init__(self, stops: list[str]):
        self.trimmer = StopTrimmer(stops)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._decoded = 0  # characters in the tokens' text so far
        self._sent = 0  # characters handed out
        self._pending: deque[tuple[int, int, TokenLogprob]] = deque()  # (start, end, token)
        self.finished = False

    @property
    def stopped(self) -> bool:
        return self.trimmer.stopped

    def feed(self, text: str, tokens: Sequence[TokenLogprob] = ()) -> tuple[str, list[tuple[int, TokenLogprob]]]:
        """Text that can be sent now, and the (character offset, token) pairs that go with it."""
        for token in tokens:
            start = self._decoded
            self._decoded += len(self._decoder.decode(token.bytes))
            open_character = 1 if self._decoder.getstate()[0] else 0
            self._pending.append((start, self._decoded + open_character, token))
        out = self.trimmer.feed(text)
        self._sent += len(out)
        return out, self._release()

    def finish(self) -> tuple[str, list[tuple[int, TokenLogprob]]]:
        """The rest of the text and its tokens, at the end of the choice."""
        out = self.trimmer.flush()
        self._sent += len(out)
        self.finished = True
        return out, self._release()

    def _release(self) -> list[tuple[int, TokenLogprob]]:
        done = []
        while self._pending and (self._pending[0][1] <= self._sent or self.finished and not self.stopped
                                 or self.stopped and self._pending[0][0] < self._sent):
            start, _, token = self._pending.popleft()
            done.append((start, token))
        if self.stopped:
            self._pending.clear()  # wholly after the stop string's cut
        return done
