"""Where the ``tensorrt_llm`` stand-in's tokens come from (model_repository/trtllm/tensorrt_llm_standin).

Both sources take cpu_engine's ``GenerationRequest`` and report cpu_engine's ``TokenEvent`` through ``on_event``
(one event per request per step, the last one with its finish reason), and have the engine's surface the stand-in
uses: ``start``, ``submit``, ``queued``, ``active``, ``kv_occupancy``, ``kv_size``, ``shutdown``.

- ``engine``: the CPU engine itself (cpu_engine.LLMEngine, public API only), so outputs are real and the GPU
  layout's answers can be compared with the CPU layout's token for token.
- ``null``: no model compute. Each step gives every running request its next token at once, cycling through its
  own prompt (real token ids, so the text path downstream does real work); it ends at ``max_new_tokens`` or
  ``end_id``. Steps follow each other as fast as the loop runs, or every ``step_s`` (a GPU's decode iteration),
  so each token can leave as a response of its own. It measures what the serving path costs per token when the
  engine is never the bottleneck (a GPU seen from two CPU cores). It ignores sampling, stop and bad words.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from .admission import Admission
from .engine import CANCEL_POLL_S, EngineLimits, TokenEvent
from .scheduler import FinishReason, GenerationRequest

TOKEN_SOURCES = ("engine", "null")


class NullSource:
    """Tokens as fast as they are asked for: ``max_batch_size`` requests step together, the rest wait."""

    def __init__(self, limits: EngineLimits, on_event: Callable[[TokenEvent], None], step_s: float = 0.0,
                 on_queue_full: Callable[[bool], None] | None = None):
        self.limits = limits
        self.step_s = step_s
        self.on_event = on_event
        self._inbox: queue.SimpleQueue[GenerationRequest | None] = queue.SimpleQueue()
        self._waiting: deque[GenerationRequest] = deque()
        self._running: dict[str, tuple[GenerationRequest, list[int]]] = {}  # id → (request, output so far)
        self._admission = Admission(limits.max_queue_size, on_queue_full)
        self._thread = threading.Thread(target=self._run, name="null-tokens", daemon=True)

    def start(self) -> "NullSource":
        self._thread.start()
        return self

    def submit(self, request: GenerationRequest) -> None:
        if request.num_return_sequences != 1:
            raise ValueError("the null token source makes one sequence per request (num_return_sequences 1)")
        self._admission.admit_probe() if request.probe else self._admission.admit()
        self._inbox.put(request)

    @property
    def queued(self) -> int:
        return self._admission.waiting

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def kv_occupancy(self) -> float:
        """The share of a KV cache of ``max_batch_size`` × ``max_seq_len`` tokens that the running requests' prompt
        and output would hold (none is kept here), so the occupancy gauge moves as an engine's would."""
        held = sum(len(request.prompt_ids) + len(output) for request, output in list(self._running.values()))
        return held / (self.limits.max_batch_size * self.limits.max_seq_len)

    kv_size = None  # no cache of its own

    def shutdown(self, timeout: float | None = None) -> None:
        self._admission.stop()
        self._inbox.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        next_cancel_check = next_step = 0.0
        while True:
            if self.step_s and self._running:  # the next decode iteration, not before
                next_step = max(next_step + self.step_s, time.monotonic())
                time.sleep(max(next_step - time.monotonic(), 0.0))
            idle = not self._running and not self._waiting
            if idle and self._admission.stopping and self._inbox.empty():
                return
            try:
                item = self._inbox.get(block=idle)
                while True:
                    if item is not None and item.probe:  # a liveness probe never waits for a slot
                        self._running[item.request_id] = (item, [])
                        self._admission.left_queue(count=0, probes=1)
                    elif item is not None:
                        self._waiting.append(item)
                    item = self._inbox.get_nowait()
            except queue.Empty:
                pass
            while self._waiting and len(self._running) < self.limits.max_batch_size:
                request = self._waiting.popleft()
                self._running[request.request_id] = (request, [])
                self._admission.left_queue()
            if time.monotonic() >= next_cancel_check:
                next_cancel_check = time.monotonic() + CANCEL_POLL_S
                for request_id, (request, output) in list(self._running.items()):
                    if request.is_cancelled():
                        self._end(request, output, None, FinishReason.CANCELLED)
            for request, output in list(self._running.values()):
                self._step(request, output)

    def _step(self, request: GenerationRequest, output: list[int]) -> None:
        prompt = request.prompt_ids
        token = prompt[len(output) % len(prompt)]
        if token == request.end_id:
            self._end(request, output, None, FinishReason.STOP)
            return
        output.append(token)
        if len(output) >= request.max_new_tokens:
            self._end(request, output, token, FinishReason.LENGTH)
        else:
            self.on_event(TokenEvent(request.request_id, token, None, len(prompt), len(output)))

    def _end(self, request: GenerationRequest, output: list[int], token: int | None, reason: FinishReason) -> None:
        del self._running[request.request_id]
        self.on_event(TokenEvent(request.request_id, token, reason, len(request.prompt_ids), len(output)))

