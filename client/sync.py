"""Blocking client over ``tritonclient.grpc``.

The ensemble is decoupled, so Triton refuses unary ModelInfer for it: every request, streamed or not,
goes over the bidirectional stream API. tritonclient allows one open stream per client, so an
``LLMClient`` runs one request at a time; use one client per thread for concurrency (or ``AsyncLLMClient``).
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.core import (Chunk, Completion, Health, Message, ResponseCollector, SamplingParams, build_chat_inputs,
                         build_inputs, is_final, one_sequence, stop_inputs, to_error)

# How long to wait for a dead stream's callback to report why it died.
_CALLBACK_GRACE_S = 5.0


class TextStream(Iterator[str]):
    """Text deltas of one streamed request. ``completion`` is set once the final response has arrived.

    Iterating gives text only, for one sequence; ``chunks()`` gives ``Chunk``s instead (text, log-probs, the
    sequence index and its finish reason), which a request for ``n`` > 1 sequences needs: theirs interleave.
    Use one or the other. The request is sent when iteration starts. Closing the stream early (``close()``,
    ``break`` out of a ``with`` block, garbage collection) cancels the request so the server frees its slot.
    """

    def __init__(self, chunks: Iterator[Chunk], collector: ResponseCollector, sequences: int):
        self._chunks = chunks
        self._collector = collector
        self._sequences = sequences

    @property
    def completion(self) -> Completion | None:
        return self._collector.completion

    @property
    def completions(self) -> list[Completion] | None:
        """One per sequence, in index order, once the final response has arrived."""
        return self._collector.completions

    def chunks(self) -> Iterator[Chunk]:
        return self._chunks

    @property
    def request_id(self) -> str:
        return self._collector.request_id

    def __next__(self) -> str:
        if self._sequences > 1:
            raise TypeError(f"this stream carries {self._sequences} sequences: iterate stream.chunks()")
        while not (chunk := next(self._chunks)).text:
            pass
        return chunk.text

    def close(self) -> None:
        self._chunks.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LLMClient:
    """Text generation against a Triton ensemble over gRPC. One request at a time per client."""

    def __init__(self, url: str = "localhost:8001", model: str = "ensemble", timeout: float | None = None,
                 stop_model: str | None = "llm"):
        """``timeout``: deadline in seconds for each request's stream (``None``: no deadline).
        ``stop_model``: the LLM model to send ``stop`` to when a request is abandoned (None: don't)."""
        self.url = url
        self.model = model
        self.stop_model = stop_model
        self._timeout = timeout
        self._client_factory = grpcclient.InferenceServerClient
        self._grpc = self._client_factory(url)
        self._busy = threading.Lock()

    def generate(self, prompt: str, params: SamplingParams | None = None) -> Completion:
        """Generate the whole completion in one response (``stream=false``); one sequence (``n`` > 1:
        ``generate_n``)."""
        return self.generate_n(prompt, one_sequence(params, "generate_n"))[0]

    def generate_n(self, prompt: str, params: SamplingParams | None = None, *,
                   request_id: str | None = None) -> list[Completion]:
        """``params.n`` sequences for one prompt (the prompt is prefilled once), in index order."""
        params = params or SamplingParams()
        return self._complete(build_inputs(prompt, params, stream=False), params, request_id)

    def stream(self, prompt: str, params: SamplingParams | None = None, *,
               request_id: str | None = None) -> TextStream:
        """Stream text deltas as the server produces them; see ``TextStream``."""
        params = params or SamplingParams()
        return self._stream(build_inputs(prompt, params, stream=True), params, request_id)

    def chat(self, messages: Sequence[Message], params: SamplingParams | None = None) -> Completion:
        """The assistant's next turn for a conversation (``[{"role": ..., "content": ...}, ...]``), in one
        response. The server applies the model's chat template; the turn ends at the model's end of turn
        (finish_reason ``stop``), which is not part of the text. One sequence (``n`` > 1: ``chat_n``)."""
        return self.chat_n(messages, one_sequence(params, "chat_n"))[0]

    def chat_n(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
               tools: Sequence[Mapping] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
               request_id: str | None = None) -> list[Completion]:
        """``params.n`` alternative turns for one conversation, in index order."""
        params = params or SamplingParams()
        return self._complete(build_chat_inputs(messages, params, False, tools, chat_template_kwargs), params,
                              request_id)

    def stream_chat(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
                    tools: Sequence[Mapping] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                    request_id: str | None = None) -> TextStream:
        """``chat``, streamed as text deltas; see ``TextStream``."""
        params = params or SamplingParams()
        return self._stream(build_chat_inputs(messages, params, True, tools, chat_template_kwargs), params,
                            request_id)

    def health(self) -> Health:
        try:
            return Health(live=self._grpc.is_server_live(), ready=self._grpc.is_server_ready(),
                          model_ready=self._grpc.is_model_ready(self.model))
        except InferenceServerException as exc:
            raise to_error(exc, self.url) from None

    def close(self) -> None:
        self._grpc.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _complete(self, inputs: list[grpcclient.InferInput], params: SamplingParams,
                        request_id: str | None = None) -> list[Completion]:
        collector = ResponseCollector(request_id or uuid.uuid4().hex, params)
        for _ in self._run(inputs, collector):
            pass
        assert collector.completions is not None  # _run only ends normally after the final response
        return collector.completions

    def _stream(self, inputs: list[grpcclient.InferInput], params: SamplingParams,
                request_id: str | None = None) -> TextStream:
        """Inputs are built by the caller, so bad params fail there, not at the first ``next``."""
        collector = ResponseCollector(request_id or uuid.uuid4().hex, params)
        return TextStream(self._run(inputs, collector), collector, params.sequences)

    def _run(self, inputs: list[grpcclient.InferInput], collector: ResponseCollector) -> Iterator[Chunk]:
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("LLMClient runs one request at a time; finish or close the current stream first")
        responses: queue.SimpleQueue = queue.SimpleQueue()
        finished = False
        try:
            try:
                self._grpc.start_stream(callback=lambda result, error: responses.put((result, error)),
                                        stream_timeout=self._timeout)
            except InferenceServerException as exc:
                raise to_error(exc, self.url) from None
            collector.mark_sent()
            try:
                self._grpc.async_stream_infer(self.model, inputs, request_id=collector.request_id,
                                              enable_empty_final_response=True)
            except InferenceServerException as exc:
                # The stream died before the request was queued (e.g. connection refused): the reason
                # arrives through the callback; tritonclient's own message only says "see the callback".
                try:
                    exc = responses.get(timeout=_CALLBACK_GRACE_S)[1] or exc
                except queue.Empty:
                    pass
                raise to_error(exc, self.url) from None
            while not finished:
                result, error = responses.get()
                if error is not None:
                    # An error the server sent (no gRPC status) ends the request there: nothing to cancel or
                    # stop. A transport error (with a status) may leave it running.
                    finished = error.status() is None
                    raise to_error(error, self.url)
                finished = is_final(result)  # set before yielding: the caller may stop right after
                chunk = collector.add(result)
                if chunk is not None:
                    yield chunk
        finally:
            # Anything short of a final response or a server error (caller stopped early, transport) cancels.
            self._grpc.stop_stream(cancel_requests=not finished)
            if not finished and collector.sent:
                self._stop_on_server(collector.request_id)
            self._busy.release()

    def _stop_on_server(self, request_id: str) -> None:
        """Best effort: the request may already have ended (then the model answers "no running request").

        A client of its own, so the stop never waits on (or fails with) the stream being torn down.
        """
        if self.stop_model is None:
            return
        done = threading.Event()
        stopper = self._client_factory(self.url)
        try:
            stopper.start_stream(callback=lambda result, error: done.set())
            stopper.async_stream_infer(self.stop_model, stop_inputs(), request_id=request_id,
                                       enable_empty_final_response=True)
            done.wait(_CALLBACK_GRACE_S)
        except InferenceServerException:
            pass
        finally:
            stopper.stop_stream()
            stopper.close()
