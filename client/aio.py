"""asyncio client over ``tritonclient.grpc.aio``.

Each request opens its own gRPC stream (the ensemble is decoupled, so unary ModelInfer is refused), so
one ``AsyncLLMClient`` can run many requests concurrently on its event loop. Create and use it inside
one running event loop.

A stream the caller leaves early (``break``, a closed stream, a cancelled task) is not cancelled mid-call: a call
cancelled mid-stream can leave Triton 2.51 holding the model, so SIGTERM waits out its exit timeout and exits 1
(docs/reliability.md, cause D). The request gets TensorRT-LLM's ``stop`` instead, and its call is read to the end in
the background (cancelled only if it has not ended ``ABANDONED_END_TIMEOUT_S`` later, or at once without a
``stop_model``). ``close()`` (or leaving ``async with``) waits for that: an event loop closed without it cancels
the calls still open.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException

from client.core import (Chunk, Completion, GenerationError, Health, Message, ResponseCollector, SamplingParams,
                         build_chat_inputs, build_inputs, is_final, one_sequence, stop_inputs, to_error)

# After the final response the server closes the call at once; this only bounds a server that does not.
CALL_END_TIMEOUT_S = 5.0
# An abandoned call, its `stop` sent, is read to its final response (a step or two); cancelled only past this.
ABANDONED_END_TIMEOUT_S = 10.0
_END = object()  # what a call's reader queues after its last item


class AsyncTextStream(AsyncIterator[str]):
    """Text deltas of one streamed request. ``completion`` is set once the final response has arrived.

    Iterating gives text only, for one sequence; ``chunks()`` gives ``Chunk``s instead (see ``client.TextStream``).
    The request is sent when iteration starts. Closing the stream early (``aclose()``, leaving an ``async with``
    block) stops the request on the server, which frees its slot (module docstring).
    """

    def __init__(self, chunks: AsyncGenerator[Chunk, None], collector: ResponseCollector, sequences: int):
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

    def chunks(self) -> AsyncGenerator[Chunk, None]:
        return self._chunks

    @property
    def request_id(self) -> str:
        return self._collector.request_id

    async def __anext__(self) -> str:
        if self._sequences > 1:
            raise TypeError(f"this stream carries {self._sequences} sequences: iterate stream.chunks()")
        while not (chunk := await self._chunks.__anext__()).text:
            pass
        return chunk.text

    async def aclose(self) -> None:
        await self._chunks.aclose()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class AsyncLLMClient:
    """Text generation against a Triton ensemble over gRPC (asyncio). Concurrent requests are fine.

    Create it inside the event loop that uses it: gRPC's asyncio channel binds to the loop it starts on.
    """

    def __init__(self, url: str = "localhost:8001", model: str = "ensemble", timeout: float | None = None,
                 stop_model: str | None = "llm"):
        """``timeout``: deadline in seconds for each request's stream (``None``: no deadline).
        ``stop_model``: the LLM model to send ``stop`` to when a request is abandoned (None: don't)."""
        self.url = url
        self.model = model
        self.stop_model = stop_model
        self._timeout = timeout
        self._grpc = grpcclient_aio.InferenceServerClient(url)
        # Each call's reader, and each abandoned call's ending (`stop`, then read to its end): close() waits for them.
        self._background: set[asyncio.Task] = set()
        self._closed = False

    async def generate(self, prompt: str, params: SamplingParams | None = None) -> Completion:
        """Generate the whole completion in one response (``stream=false``); one sequence (``n`` > 1:
        ``generate_n``)."""
        return (await self.generate_n(prompt, one_sequence(params, "generate_n")))[0]

    async def generate_n(self, prompt: str, params: SamplingParams | None = None, *,
                         request_id: str | None = None) -> list[Completion]:
        """``params.n`` sequences for one prompt, in index order; see ``LLMClient.generate_n``."""
        params = params or SamplingParams()
        return await self._complete(build_inputs(prompt, params, stream=False), params, request_id)

    def stream(self, prompt: str, params: SamplingParams | None = None, *,
               request_id: str | None = None) -> AsyncTextStream:
        """Stream text deltas: ``async for delta in client.stream(...)``; see ``AsyncTextStream``."""
        params = params or SamplingParams()
        return self._stream(build_inputs(prompt, params, stream=True), params, request_id)

    async def chat(self, messages: Sequence[Message], params: SamplingParams | None = None) -> Completion:
        """The assistant's next turn for a conversation, in one response; see ``LLMClient.chat``."""
        return (await self.chat_n(messages, one_sequence(params, "chat_n")))[0]

    async def chat_n(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
                     tools: Sequence[Mapping] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                     request_id: str | None = None) -> list[Completion]:
        """``params.n`` alternative turns for one conversation, in index order."""
        params = params or SamplingParams()
        return await self._complete(build_chat_inputs(messages, params, False, tools, chat_template_kwargs), params,
                                    request_id)

    def stream_chat(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
                    tools: Sequence[Mapping] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                    request_id: str | None = None) -> AsyncTextStream:
        """``chat``, streamed: ``async for delta in client.stream_chat(...)``; see ``AsyncTextStream``."""
        params = params or SamplingParams()
        return self._stream(build_chat_inputs(messages, params, True, tools, chat_template_kwargs), params,
                            request_id)

    async def _complete(self, inputs: list[grpcclient.InferInput], params: SamplingParams,
                        request_id: str | None = None) -> list[Completion]:
        collector = ResponseCollector(request_id or uuid.uuid4().hex, params)
        async for _ in self._run(inputs, collector):
            pass
        assert collector.completions is not None  # _run only ends normally after the final response
        return collector.completions

    def _stream(self, inputs: list[grpcclient.InferInput], params: SamplingParams,
                request_id: str | None = None) -> AsyncTextStream:
        """Inputs are built by the caller, so bad params fail there, not at the first ``anext``."""
        collector = ResponseCollector(request_id or uuid.uuid4().hex, params)
        return AsyncTextStream(self._run(inputs, collector), collector, params.sequences)

    async def health(self) -> Health:
        try:
            return Health(live=await self._grpc.is_server_live(), ready=await self._grpc.is_server_ready(),
                          model_ready=await self._grpc.is_model_ready(self.model))
        except InferenceServerException as exc:
            raise to_error(exc, self.url) from None

    async def close(self, timeout_s: float = ABANDONED_END_TIMEOUT_S + CALL_END_TIMEOUT_S) -> None:
        """Wait up to ``timeout_s`` for the calls still being read (abandoned ones included), then close the
        channel, which ends any left."""
        if self._background:
            await asyncio.wait(self._background, timeout=timeout_s)
        self._closed = True
        await self._grpc.close()

    def _in_background(self, coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def __aenter__(self) -> AsyncLLMClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _stop_on_server(self, request_id: str) -> None:
        """Best effort, see ``client.core.stop_inputs``; the request may already have ended."""
        if self.stop_model is None:
            return

        async def one_request():
            yield {"model_name": self.stop_model, "inputs": stop_inputs(), "request_id": request_id,
                   "parameters": {"triton_enable_empty_final_response": True}}

        try:  # one response (final, or "no running request"), then the call's status: read it all (B5)
            await _read_to_end(self._grpc.stream_infer(one_request()))
        except InferenceServerException:
            pass

    async def _run(self, inputs: list[grpcclient.InferInput],
                   collector: ResponseCollector) -> AsyncGenerator[Chunk, None]:
        request = {
            "model_name": self.model,
            "inputs": inputs,
            "request_id": collector.request_id,
            # What the sync client's enable_empty_final_response=True sets: the final flag always arrives.
            "parameters": {"triton_enable_empty_final_response": True},
        }

        async def one_request():
            yield request

        collector.mark_sent()
        responses = self._grpc.stream_infer(one_request(), stream_timeout=self._timeout)
        # A task of the client's own reads the call: grpcio cancels a call when the task awaiting its next response is
        # cancelled, and a call cancelled mid-stream can leave Triton 2.51 holding the model (docs/reliability.md,
        # cause D). The caller's cancellation lands on the queue instead; the call is then stopped and read to its end.
        received: asyncio.Queue = asyncio.Queue()
        reader = self._in_background(_read_into(responses, received))
        finished = False
        try:
            while (item := await received.get()) is not _END:
                if isinstance(item, grpc.RpcError):  # transport failures are raised, not returned as (None, error)
                    raise to_error(item, self.url) from None
                result, error = item
                if error is not None:  # an error ends the request on the server: nothing to stop
                    finished = True
                    raise to_error(error, self.url)
                finished = is_final(result)  # set before yielding: the caller may stop right after
                chunk = collector.add(result)
                if chunk is not None:
                    yield chunk
                if finished:
                    return
        finally:
            # Anything short of a final response or an error (caller stopped early, transport failure) is stopped.
            if not finished:
                self._in_background(self._end_abandoned(responses, reader, collector.request_id))
        raise GenerationError("the server closed the stream before sending a final response")

    async def _end_abandoned(self, responses, reader: asyncio.Task, request_id: str) -> None:
        """`stop` to the LLM model, then the call read to its final response; cancelled only if it does not end."""
        try:
            if not self._closed:  # else the channel is closed, which ended the call
                await self._stop_on_server(request_id)
                await asyncio.wait({reader}, timeout=ABANDONED_END_TIMEOUT_S if self.stop_model else 0)
        except Exception:  # noqa: BLE001 - best effort, as the stop itself: the call is cancelled below
            pass
        finally:
            if not reader.done():
                responses.cancel()
                reader.cancel()


async def _read_into(responses, received: asyncio.Queue) -> None:
    """Every item of the call, then ``_END``; a transport error as the last item; bounded after the final response."""
    try:
        async for result, error in responses:
            received.put_nowait((result, error))
            if error is not None or is_final(result):
                await _read_to_end(responses)
                break
    except grpc.RpcError as exc:
        received.put_nowait(exc)
    finally:
        received.put_nowait(_END)


async def _read_to_end(responses) -> None:
    """Read the call's status after its final response or error. A call the client drops before that can leave
    Triton 2.51 holding a reference to the model, and SIGTERM then waits the whole exit timeout and exits 1
    (docs/reliability.md, B5)."""
    try:
        async with asyncio.timeout(CALL_END_TIMEOUT_S):
            async for _ in responses:
                pass
    except (TimeoutError, grpc.RpcError):
        responses.cancel()
