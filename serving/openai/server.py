"""Routes of the OpenAI front door, and the ASGI layer in front of them: API keys, drain, metrics.

A request's life: the ``FrontDoor`` middleware checks the key (constant-time) and the drain, counts it in flight;
the route parses the body strictly (protocol.py), checks the model id, and runs the request on the ensemble
through the project's asyncio gRPC client in a task of its own (streaming.py says why). A streamed request waits
for Triton's first answer before it sends headers, so an error the engine finds before the first token (a prompt
too long, a full queue) still gets its own status; later errors arrive as an SSE error event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from tritonclient.utils import InferenceServerException

from client import Completion, Guide, SamplingParams, TokenLogprob, TopLogprob
from serving.openai.backend import COMPLETIONS_DEFAULT_MAX_TOKENS, Backend, ModelInfo
from serving.openai.errors import (OpenAIError, bad_request, context_length_exceeded, from_tokenizer, from_triton,
                                   from_validation, unavailable)
from serving.openai.engine_metrics import EngineMetricsRelay
from serving.openai.metrics import FrontDoorMetrics
from serving.openai.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion,
                                     ChatCompletionChunk, ChatCompletionRequest, ChoiceLogprobs, CompletionChoice,
                                     CompletionLogprobs, CompletionRequest, Delta, DetokenizeRequest,
                                     DetokenizeResponse, DeltaFunction, DeltaToolCall, FunctionCall, ModelCard,
                                     ModelList, ResponsesRequest, TextCompletion, TokenizeRequest, TokenizeResponse,
                                     ToolCallOut, Usage, json_logprob)
from serving.openai.responses import ResponseBuilder
from serving.openai.streaming import ChoiceText, ClientGone, Generation, Tasks, unless_disconnected
from serving.openai.tool_parser import CallDelta, ToolCallParser
from serving.tools import ToolError, functions, tool_guide

OPEN_PATHS = frozenset({"/health", "/health/live"})  # no API key: probes
UNCOUNTED_PATHS = OPEN_PATHS | {"/metrics"}  # still answered while draining, not waited for
ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/tokenize",
                    "/detokenize", "/health", "/health/live", "/metrics"})
# A Responses request's parameters under their chat names (errors name what the client sent).
_RESPONSES_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
MAX_BODY_BYTES = 8 * 2**20
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_ID_HEADER = "x-request-id"
# A client's request id is echoed and becomes the Triton request id (logs, `stop`, traces line up): printable ASCII.
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


class FrontDoor:
    """The state one front-door process shares: its Triton backend, keys, drain flag, requests in flight."""

    def __init__(self, triton_url: str, served_model_name: str | None = None, api_keys: Sequence[str] = (),
                 drain_timeout_s: float = 30.0, engine_metrics: EngineMetricsRelay | None = None):
        self.triton_url = triton_url
        self.served_model_name = served_model_name
        self._keys = [k.encode() for k in api_keys if k]
        self.drain_timeout_s = drain_timeout_s
        self.metrics = FrontDoorMetrics()
        self.tasks = Tasks()
        self.backend: Backend | None = None
        self.draining = False
        self.in_flight = 0
        self._info_task: asyncio.Task | None = None
        # The engine gauges for a gateway's endpoint picker: without a key, never waited for by the drain.
        self.engine_metrics = engine_metrics
        relayed = {engine_metrics.path} if engine_metrics else set()
        if relayed & ROUTES:
            raise ValueError(f"the engine metrics path {engine_metrics.path} is one of the API's own routes")
        self.open_paths = OPEN_PATHS | relayed
        self.uncounted_paths = UNCOUNTED_PATHS | relayed

    # ---- lifecycle (inside the serving event loop)
    async def start(self) -> None:
        self.backend = Backend(self.triton_url, self.served_model_name)
        self._info_task = asyncio.ensure_future(self.backend.wait_info())

    async def model_info(self) -> ModelInfo:
        """Waits until Triton has loaded the models (the CLI announces readiness after this)."""
        assert self._info_task is not None, "start() first"
        return await asyncio.shield(self._info_task)

    async def stop(self) -> None:
        if self._info_task is not None:
            self._info_task.cancel()
        await self.tasks.cancel_all(timeout_s=5.0)  # every gRPC call read to its end before the channel closes
        if self.backend is not None:
            await self.backend.close()

    async def drain(self) -> None:
        """Refuse new requests (503), then wait until those in flight are done or the drain timeout passes."""
        self.draining = True
        deadline = time.monotonic() + self.drain_timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # ---- per request
    def authorized(self, authorization: bytes | None) -> bool:
        if not self._keys:
            return True
        scheme, _, token = (authorization or b"").partition(b" ")
        ok = False
        for key in self._keys:  # every key compared, constant time each: no early exit to time
            ok |= hmac.compare_digest(token.strip(), key)
        return ok and scheme.lower() == b"bearer"

    def info(self) -> ModelInfo:
        if self.backend is None or self.backend.info is None:
            raise unavailable("The model server is starting: the model is not loaded yet", "starting")
        return self.backend.info


class FrontDoorMiddleware:
    """Pure ASGI (no per-request task): keys, drain, in-flight count and the request metrics."""

    def __init__(self, app, front: FrontDoor):
        self.app = app
        self.front = front

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        front = self.front
        route = path if path in ROUTES or path in front.open_paths else (
            "/v1/models/{model}" if path.startswith("/v1/models/") else "other")
        metrics, start = front.metrics, time.perf_counter()
        status, sse, first_body = 0, False, None
        headers = dict(scope["headers"])
        # The client's X-Request-Id, else a new one: echoed on every answer, and the Triton request id.
        request_id = headers.get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1") or uuid.uuid4().hex
        bad_id = not _REQUEST_ID.match(request_id)
        if bad_id:
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_observed(message):
            nonlocal status, sse, first_body
            if message["type"] == "http.response.start":
                status = message["status"]
                sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in message["headers"])
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID_HEADER.encode(), request_id.encode("latin-1"))]}
            elif message["type"] == "http.response.body" and first_body is None and message.get("body"):
                first_body = time.perf_counter()
            await send(message)

        counted = path not in front.uncounted_paths
        try:
            if bad_id:
                error = bad_request("X-Request-Id must be 1-128 printable ASCII characters without spaces",
                                    param="X-Request-Id", code="invalid_request_id")
                return await error.response()(scope, receive, send_observed)
            if path not in front.open_paths and not front.authorized(headers.get(b"authorization")):
                error = OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                return await error.response()(scope, receive, send_observed)
            if front.draining and counted:
                error = unavailable("The server is shutting down and accepts no new requests; retry on another "
                                    "replica", "draining")
                error.headers["Connection"] = "close"
                return await error.response()(scope, receive, send_observed)
            if counted:
                front.in_flight += 1
                metrics.in_flight.inc()
            try:
                await self.app(scope, receive, send_observed)
            finally:
                if counted:
                    front.in_flight -= 1
                    metrics.in_flight.dec()
        finally:
            end = time.perf_counter()
            metrics.requests.labels(route, str(status or 500)).inc()
            metrics.latency.labels(route).observe(end - start)
            if sse and status == 200 and first_body is not None:
                metrics.ttft.labels(route).observe(first_body - start)


# ------------------------------------------------------------------------------------------------------ helpers

async def _parse(request: Request, model: type[BaseModel]):
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise OpenAIError(413, f"The request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}",
                          code="request_too_large")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation(exc) from None


# max_tokens when a chat request sends none: the rest of the context (preprocessing's -1), as vLLM, so a long answer or
# a tool call's JSON is never cut at an arbitrary length.
CONTEXT_END = -1


def _sampling(req: ChatCompletionRequest | CompletionRequest, info: ModelInfo,
              default_max_tokens: int) -> SamplingParams:
    if req.model != info.id:
        raise OpenAIError(404, f"The model '{req.model}' does not exist; this server serves '{info.id}'",
                          param="model", code="model_not_found")
    max_tokens = req.requested_max_tokens
    param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif max_tokens >= info.max_seq_len:
        raise context_length_exceeded(f"This model's maximum context length is {info.max_seq_len} tokens: "
                                      f"{param}={max_tokens} leaves no room for a prompt", param)
    beyond = [token for token in req.token_bias if token >= info.vocab_size]
    if beyond:
        raise bad_request(f"'logit_bias' names token {beyond[0]}, which is not in the model's vocabulary of "
                          f"{info.vocab_size} tokens", param="logit_bias")
    seed = None if req.seed is None else req.seed % 2**64  # OpenAI's int64 seed as the engine's uint64
    alternatives = req.alternatives
    temperature = req.temperature
    if req.choices > 1 and temperature is None and req.top_p is None:
        temperature = 1.0  # n choices ask for different answers: OpenAI's default temperature, not greedy n times
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=req.top_p, top_k=req.top_k, seed=seed,
        stop=req.stop_words, min_tokens=req.min_tokens, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty, min_p=req.min_p,
        n=None if req.choices == 1 else req.choices, logprobs=None if alternatives is None else True,
        top_logprobs=alternatives or None, guide=_guide(req), logit_bias=req.token_bias)


def _guide(req: ChatCompletionRequest | CompletionRequest) -> Guide | None:
    """The tool guide when the model may call tools (serving/tools.py), else response_format (chat only, as OpenAI
    has it), as TensorRT-LLM's guided decoding."""
    tools = getattr(req, "offered_tools", None)
    if tools:
        try:
            guide = tool_guide(functions(tools), req.tool_mode, req.parallel_tool_calls is not False)
        except ToolError as exc:
            raise bad_request(str(exc), param="tool_choice" if "tool_choice" in str(exc) else "tools") from None
        return Guide.structural_tag(guide)
    response_format = getattr(req, "response_format", None)
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":  # OpenAI's JSON mode answers an object; the `json` guide allows arrays
        return Guide.json_schema({"type": "object"})
    return Guide.json_schema(response_format.json_schema.schema_)


def _finish_reason(engine_reason: str, stopped: bool, called: bool = False) -> str:
    if called and engine_reason == "stop":
        return "tool_calls"
    if stopped:
        return "stop"
    if engine_reason in ("stop", "length"):
        return engine_reason
    raise OpenAIError(503, f"The model server ended the request early (finish_reason {engine_reason!r})",
                      code="cancelled")


def _responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    base = head.split("[", 1)[0]
    return _RESPONSES_PARAMS.get(base, base) + head[len(base):] + dot + rest if base in _RESPONSES_PARAMS else param


def _sse(obj: BaseModel | dict) -> str:
    data = obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n"


def _usage(completions: list[Completion]) -> Usage:
    """The prompt is counted once; every choice's tokens are completion tokens (OpenAI's usage with n > 1)."""
    return Usage.of(completions[0].num_input_tokens, sum(c.num_output_tokens for c in completions),
                    completions[0].num_cached_tokens)


def _entry(token: TopLogprob) -> dict:
    return {"token": token.token, "bytes": list(token.bytes), "logprob": json_logprob(token.logprob)}


def _chat_logprobs(tokens: list[tuple[int, TokenLogprob]]) -> ChoiceLogprobs:
    # Plain dicts validated once: a model per alternative cost ~70 µs a token with 20 of them, this ~45 µs.
    return ChoiceLogprobs.model_validate({"content": [{**_entry(token), "top_logprobs": [_entry(t) for t in token.top]}
                                                      for _, token in tokens]})


def _completion_logprobs(tokens: list[tuple[int, TokenLogprob]]) -> CompletionLogprobs:
    """The legacy shape; each alternatives dict also holds the chosen token, as OpenAI's does (an alternative that
    reads the same, e.g. another part of a split character, gives way to it)."""
    tops = []
    for _, token in tokens:
        top = {t.token: json_logprob(t.logprob) for t in token.top}
        top[token.token] = json_logprob(token.logprob)
        tops.append(top)
    return CompletionLogprobs(tokens=[token.token for _, token in tokens],
                              token_logprobs=[json_logprob(token.logprob) for _, token in tokens],
                              top_logprobs=tops, text_offset=[offset for offset, _ in tokens])


class _Kind:
    """What differs between chat and completions: the request type, ids, and the shape of a choice."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.prompt_param = "messages" if chat else "prompt"
        self.id_prefix = "chatcmpl-" if chat else "cmpl-"
        # The legacy endpoint asks for alternatives with its ``logprobs`` count.
        self.renamed = {} if chat else {"top_logprobs": "logprobs"}

    def logprobs(self, tokens: list[tuple[int, TokenLogprob]], asked: bool):
        if not asked:
            return None
        return _chat_logprobs(tokens) if self.chat else _completion_logprobs(tokens)


CHAT, COMPLETIONS = _Kind(True), _Kind(False)


# ------------------------------------------------------------------------------------------------------- the app

def create_app(front: FrontDoor, cors_origins: Sequence[str] = ()) -> FastAPI:
    async def lifespan(_app):
        await front.start()
        yield
        await front.stop()

    app = FastAPI(title="triton-llm-stack OpenAI front door", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, exc: RequestValidationError):  # FastAPI's 422, as OpenAI's 400
        errors = exc.errors()
        loc = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        return bad_request(f"Invalid request: {errors[0]['msg'] if errors else exc}", param=loc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return OpenAIError(404, f"Unknown request URL: {request.method} {request.url.path}",
                               code="unknown_url").response()
        if exc.status_code == 405:
            return OpenAIError(405, f"Method {request.method} is not allowed for {request.url.path}",
                               code="method_not_allowed").response()
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_request, exc: Exception):
        return OpenAIError(500, f"Internal error: {type(exc).__name__}: {exc}", code="internal_error").response()

    @app.get("/health/live")
    async def live():
        return {"status": "live"}

    @app.get("/health")
    async def health():
        if front.draining:
            return unavailable("The server is shutting down", "draining").response()
        if front.backend is None or not await front.backend.ready():
            return unavailable("The model server is not ready", "starting").response()
        return {"status": "ready", "model": front.backend.info.id}

    @app.get("/metrics")
    async def metrics():
        return Response(front.metrics.render(), media_type=PROMETHEUS_TEXT)

    if front.engine_metrics is not None:
        @app.get(front.engine_metrics.path, include_in_schema=False)
        async def engine_metrics():
            try:
                return Response(await front.engine_metrics.render(), media_type=PROMETHEUS_TEXT)
            except OSError as exc:  # a scrape error for the picker, not an empty page that reads as an idle engine
                return unavailable(f"The engine's metrics are unavailable: {exc}", "metrics_unavailable").response()

    def card(info: ModelInfo) -> ModelCard:
        return ModelCard(id=info.id, created=info.created, max_model_len=info.max_seq_len)

    @app.get("/v1/models")
    async def models():
        return JSONResponse(ModelList(data=[card(front.info())]).model_dump())

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        info = front.info()
        if model != info.id:
            raise OpenAIError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")
        return JSONResponse(card(info).model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest)
        info = front.info()
        params = _sampling(req, info, CONTEXT_END)
        messages = [m.plain() for m in req.messages]
        return await _generate(request, CHAT, req, info, params, messages)

    def served(model: str | None) -> ModelInfo:
        info = front.info()
        if model is not None and model != info.id:
            raise OpenAIError(404, f"The model '{model}' does not exist; this server serves '{info.id}'",
                              param="model", code="model_not_found")
        return info

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's /tokenize: the ids the model would get for this prompt or chat."""
        req = await _parse(request, TokenizeRequest)
        info = served(req.model)
        messages = None if req.messages is None else json.dumps([m.plain() for m in req.messages], ensure_ascii=False)
        tools = json.dumps([t.openai() for t in req.tools], ensure_ascii=False) if req.tools else None
        kwargs = json.dumps(req.chat_template_kwargs) if req.chat_template_kwargs else None
        try:
            ids = await front.backend.tokenize(req.prompt, messages, tools, kwargs)
        except InferenceServerException as exc:
            raise from_tokenizer(exc, "prompt" if req.prompt is not None else "messages") from None
        return JSONResponse(TokenizeResponse(count=len(ids), max_model_len=info.max_seq_len, tokens=ids).model_dump())

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's /detokenize: the text of token ids."""
        req = await _parse(request, DetokenizeRequest)
        info = served(req.model)
        beyond = [token for token in req.tokens if not 0 <= token < info.vocab_size]
        if beyond:
            raise bad_request(f"'tokens' holds {beyond[0]}, which is not a token id of this model (0 to "
                              f"{info.vocab_size - 1})", param="tokens", code="invalid_value")
        try:
            text = await front.backend.detokenize(req.tokens)
        except InferenceServerException as exc:
            raise from_tokenizer(exc, "tokens") from None
        return JSONResponse(DetokenizeResponse(prompt=text).model_dump())

    @app.post("/v1/responses")
    async def responses(request: Request):
        req = await _parse(request, ResponsesRequest)
        info = front.info()
        try:
            chat = req.chat()
            params = _sampling(chat, info, CONTEXT_END)
        except OpenAIError as exc:
            exc.param = _responses_param(exc.param)
            raise
        except ValidationError as exc:
            error = from_validation(exc)
            error.param = _responses_param(error.param)
            raise error from None
        if req.max_tool_calls == 1:
            chat.parallel_tool_calls = False
        messages = [m.plain() for m in chat.messages]
        names = _calls(chat)
        builder = ResponseBuilder(req, info.id)
        if not req.stream:
            try:
                completion = (await unless_disconnected(
                    front.tasks.start(_work(request, CHAT, chat, messages, params, False)), request.receive))[0]
            except ClientGone:
                return Response(status_code=499)
            except Exception as exc:  # noqa: BLE001 - every Triton failure gets its status
                raise _responses_error(exc) from None
            parser = ToolCallParser(names) if names else None
            text, calls = parser.feed(completion.text) if parser else (completion.text, [])
            rest, more = parser.finish() if parser else ("", [])
            for _ in (*builder.start(), *builder.add(text + rest, calls + more),
                      *builder.finish(_finish_reason(completion.finish_reason, False),
                                      completion.num_input_tokens, completion.num_output_tokens,
                                      completion.num_cached_tokens)):
                pass
            _count_tokens(Usage.of(completion.num_input_tokens, completion.num_output_tokens))
            return JSONResponse(builder.response())
        generation = Generation(_work(request, CHAT, chat, messages, params, True), front.tasks)
        try:
            first_chunk = await generation.first(request.receive)
        except ClientGone:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - an error before the first token keeps its HTTP status
            raise _responses_error(exc) from None
        return StreamingResponse(_response_events(builder, generation, first_chunk, names),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    async def _response_events(builder: ResponseBuilder, generation: Generation, first_chunk,
                               names: frozenset[str] | None) -> AsyncIterator[str]:
        parser = ToolCallParser(names) if names else None
        try:
            for event in builder.start():
                yield event
            item = first_chunk
            while item is not None:
                text, calls = parser.feed(item.text) if parser else (item.text, [])
                out = "".join(builder.add(text, calls))
                if out:
                    yield out
                item = await generation.next()
            rest, more = parser.finish() if parser else ("", [])
            completion = generation.completions[0]
            _count_tokens(Usage.of(completion.num_input_tokens, completion.num_output_tokens))
            yield "".join(builder.add(rest, more)) + "".join(builder.finish(
                _finish_reason(completion.finish_reason, False), completion.num_input_tokens,
                completion.num_output_tokens, completion.num_cached_tokens))
        except Exception as exc:  # noqa: BLE001 - after the headers, an error is an SSE event
            error = exc if isinstance(exc, OpenAIError) else _responses_error(exc)
            yield builder.event("error", code=error.code, message=error.message, param=error.param)
        finally:
            generation.abandon()

    def _responses_error(exc: Exception) -> OpenAIError:
        error = from_triton(exc, "input", _RESPONSES_PARAMS)
        error.param = _responses_param(error.param)
        return error

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest)
        info = front.info()
        params = _sampling(req, info, COMPLETIONS_DEFAULT_MAX_TOKENS)
        return await _generate(request, COMPLETIONS, req, info, params, req.text)

    def _calls(req) -> frozenset[str] | None:
        """The names of the tools the model may call (their calls are parsed out of its text), or None."""
        tools = getattr(req, "offered_tools", None)
        return frozenset(t["function"]["name"] for t in tools) if tools else None

    def _work(request: Request, kind: _Kind, req, prompt, params: SamplingParams, stream: bool):
        """The Triton request (a coroutine, or a stream), under the client's request id."""
        client, triton_id = front.backend.client, request.scope["state"]["request_id"]
        if kind.chat:
            options = {"tools": req.offered_tools or None, "chat_template_kwargs": req.chat_template_kwargs,
                       "request_id": triton_id}
            return (client.stream_chat if stream else client.chat_n)(prompt, params, **options)
        return (client.stream if stream else client.generate_n)(prompt, params, request_id=triton_id)

    async def _generate(request: Request, kind: _Kind, req, info: ModelInfo, params: SamplingParams, prompt):
        request_id = kind.id_prefix + uuid.uuid4().hex
        created = int(time.time())
        if not req.stream:
            work = front.tasks.start(_work(request, kind, req, prompt, params, False))
            try:
                completions = await unless_disconnected(work, request.receive)
            except ClientGone:
                return Response(status_code=499)  # nobody reads it; the Triton request is cancelled
            except Exception as exc:  # noqa: BLE001 - every Triton failure gets its status
                raise from_triton(exc, kind.prompt_param, kind.renamed) from None
            usage = _usage(completions)
            _count_tokens(usage)
            choices = []
            for completion in completions:
                choice = ChoiceText(params.stop)  # the same cut as a stream's, so both give the same choice
                text, tokens = choice.feed(completion.text, completion.logprobs or ())
                tail, more = choice.finish()
                logprobs = kind.logprobs(tokens + more, params.wants_logprobs)
                if kind.chat:
                    message, called = _message(text + tail, _calls(req))
                    reason = _finish_reason(completion.finish_reason, choice.stopped, called)
                    choices.append(ChatChoice(index=completion.index, message=message, logprobs=logprobs,
                                              finish_reason=reason))
                else:
                    choices.append(CompletionChoice(index=completion.index, text=text + tail, logprobs=logprobs,
                                                    finish_reason=_finish_reason(completion.finish_reason,
                                                                                 choice.stopped)))
            body = (ChatCompletion if kind.chat else TextCompletion)(id=request_id, created=created, model=info.id,
                                                                     usage=usage, choices=choices)
            return Response(body.model_dump_json(), media_type="application/json")

        generation = Generation(_work(request, kind, req, prompt, params, True), front.tasks)
        try:
            first_chunk = await generation.first(request.receive)
        except ClientGone:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - an error before the first token keeps its HTTP status
            raise from_triton(exc, kind.prompt_param, kind.renamed) from None
        return StreamingResponse(_events(kind, req, info, request_id, created, generation, first_chunk, params),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    def _chunk(kind: _Kind, request_id: str, created: int, info: ModelInfo, index: int = 0, text: str | None = None,
               role: bool = False, finish: str | None = None, logprobs=None, usage: Usage | None = None,
               no_choice: bool = False, calls: list[CallDelta] | None = None):
        if kind.chat:
            tool_calls = [DeltaToolCall(index=d.index, id=d.id, type="function" if d.id else None,
                                        function=DeltaFunction(name=d.name, arguments=d.arguments))
                          for d in calls] if calls else None
            choices = [] if no_choice else [ChatChunkChoice(
                index=index, delta=Delta(role="assistant" if role else None, content=text, tool_calls=tool_calls),
                logprobs=logprobs, finish_reason=finish)]
            return ChatCompletionChunk(id=request_id, created=created, model=info.id, choices=choices, usage=usage)
        choices = [] if no_choice else [CompletionChoice(index=index, text=text or "", logprobs=logprobs,
                                                         finish_reason=finish)]
        return TextCompletion(id=request_id, created=created, model=info.id, choices=choices, usage=usage)

    async def _events(kind: _Kind, req, info: ModelInfo, request_id: str, created: int, generation: Generation,
                      first_chunk, params: SamplingParams) -> AsyncIterator[str]:
        def chunk(**fields) -> str:
            return _sse(_chunk(kind, request_id, created, info, **fields))

        choices = [ChoiceText(params.stop) for _ in range(req.choices)]
        names = _calls(req) if kind.chat else None
        parsers = [ToolCallParser(names) for _ in range(req.choices)] if names else None
        asked = params.wants_logprobs

        def content(index: int, text: str, tokens, last: bool = False) -> str:
            """A chunk of text and/or log-probs, or of tool-call deltas; nothing when there is none (held back for a
            stop string or a call marker)."""
            calls = None
            if parsers is not None:
                text, calls = parsers[index].feed(text)
                if last:
                    more, more_calls = parsers[index].finish()
                    text, calls = text + more, calls + more_calls
            if not text and not tokens and not calls:
                return ""
            return chunk(index=index, text=text or None if calls else text, logprobs=kind.logprobs(tokens, asked),
                         calls=calls)

        def finish(index: int, engine_reason: str) -> str:
            choice = choices[index]
            text, tokens = choice.finish()
            out = content(index, text, tokens, last=True)
            called = parsers is not None and bool(parsers[index].calls)
            reason = _finish_reason(engine_reason, choice.stopped, called)
            return out + chunk(index=index, text=None if kind.chat else "", finish=reason)

        # Chat's role chunks go out in the same write as the first content: two back-to-back writes cost the
        # client a few ms of TTFT (measured in docs/benchmarks/serving.md).
        pending = "".join(chunk(index=i, text="", role=True) for i in range(req.choices)) if kind.chat else ""
        try:
            item = first_chunk
            while item is not None:
                choice = choices[item.index]
                out = content(item.index, *choice.feed(item.text, item.logprobs))
                if item.finish_reason and not choice.finished:
                    out += finish(item.index, item.finish_reason)
                if out:
                    yield pending + out
                    pending = ""
                item = await generation.next()
            if pending:
                yield pending
            completions = generation.completions
            for completion in completions:  # a choice whose end came without its own finish reason
                if not choices[completion.index].finished:
                    yield finish(completion.index, completion.finish_reason)
            usage = _usage(completions)
            _count_tokens(usage)
            if req.include_usage or req.continuous_usage:
                yield chunk(usage=usage, no_choice=True)
        except Exception as exc:  # noqa: BLE001 - after the headers, an error is an SSE event before [DONE]
            error = exc if isinstance(exc, OpenAIError) else from_triton(exc, kind.prompt_param, kind.renamed)
            yield _sse(error.body())
        finally:
            generation.abandon()  # no-op once finished; on a disconnect, cancels the Triton request
        yield "data: [DONE]\n\n"

    def _message(text: str, names: frozenset[str] | None) -> tuple[AssistantMessage, bool]:
        """A whole answer as the assistant's message: its calls parsed out when tools were offered (the same parser
        as a stream's, so both give the same calls). The second value: whether it called a tool."""
        if not names:
            return AssistantMessage(content=text), False
        parser = ToolCallParser(names)
        content, _ = parser.feed(text)
        content += parser.finish()[0]
        calls = [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parser.calls]
        return AssistantMessage(content=content if content.strip() or not calls else None,
                                tool_calls=calls or None), bool(calls)

    def _count_tokens(usage: Usage) -> None:
        front.metrics.prompt_tokens.inc(usage.prompt_tokens)
        front.metrics.completion_tokens.inc(usage.completion_tokens)

    app = FrontDoorMiddleware(app, front)
    if cors_origins:  # outermost: a browser's preflight is answered before the API-key check
        app = CORSMiddleware(app, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                             allow_headers=["*"], expose_headers=["X-Request-Id"], max_age=600)
    return app
