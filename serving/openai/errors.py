"""One error envelope for every failure, ``{"error": {"message", "type", "param", "code"}}``, and its status.

A client's mistake is never a 500: bad or unknown parameters and malformed JSON are 400 (FastAPI's 422 is
remapped), a prompt too long for the engine is 400 ``context_length_exceeded``, an unknown model or route 404, a
full engine queue 429 with Retry-After, starting or draining 503. Triton's stream API sends errors without a
status code, so a Triton error is classified by its message (the texts come from serving/request_params.py,
cpu_engine/engine.py, serving/drain.py and Triton's own queue policy; tests/test_openai_errors.py pins them).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tritonclient.utils import InferenceServerException

from client import GenerationError, ServerUnavailableError
from serving.drain import SHUTTING_DOWN

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
         503: "service_unavailable_error"}
RETRY_AFTER_S = 1


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def context_length_exceeded(message: str, param: str | None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="context_length_exceeded")


def queue_full(message: str) -> OpenAIError:
    return OpenAIError(429, message, code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})


def unavailable(message: str, code: str) -> OpenAIError:
    return OpenAIError(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


# pydantic names the union member it tried in the location ("content", "str"): not a parameter name.
_UNION_TAGS = {"str", "int", "float", "bool", "list[str]", "list[TextPart]"}


def _param_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        # Union members and validators pydantic names in the location: not a parameter.
        if part in _UNION_TAGS or isinstance(part, str) and (part.startswith(("list[", "literal[", "function-"))
                                                               or part[:1].isupper()):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def from_validation(exc: ValidationError) -> OpenAIError:
    """The first problem pydantic found, as OpenAI words it, naming the parameter."""
    errors = exc.errors(include_url=False)
    # An unknown parameter is the clearer message when it comes with others ("messages" sent to /v1/completions is
    # also "prompt" missing).
    error = next((e for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1), errors[0])
    loc, kind = tuple(error["loc"]), error["type"]
    param = _param_path(loc) or None
    if kind == "json_invalid":
        return bad_request(f"The request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}",
                           code="invalid_json")
    if kind in ("model_type", "model_attributes_type") and not loc:
        return bad_request("The request body must be a JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        if len(loc) == 1:
            return bad_request(f"Unrecognized request argument supplied: {loc[0]}", param=param,
                               code="unknown_parameter")
        return bad_request(f"Unrecognized field '{param}'", param=param, code="unknown_parameter")
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    message = error["msg"]
    if kind == "value_error":  # our own validators: their message is the sentence
        message = message.removeprefix("Value error, ")
        return bad_request(message, param=param, code="invalid_value")
    return bad_request(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def from_triton(exc: Exception, prompt_param: str, renamed: Mapping[str, str] | None = None) -> OpenAIError:
    """A failed Triton request. ``prompt_param``: "messages" or "prompt", for a prompt the engine cannot take;
    ``renamed``: the endpoint's own name for a parameter the message names (``param``)."""
    if isinstance(exc, ServerUnavailableError):
        return unavailable(f"the model server is unavailable: {exc}", "triton_unavailable")
    message = str(exc)
    if "input tokens (max_input_len)" in message:
        return context_length_exceeded(f"This model's maximum context length was exceeded: {message}", prompt_param)
    if "max_tokens must be between 1 and" in message:
        return context_length_exceeded(f"This model's maximum context length was exceeded: {message}", "max_tokens")
    if "request queue is full" in message or "Exceeds maximum queue size" in message:
        return queue_full(f"The server is at capacity: {message}")
    if SHUTTING_DOWN in message or "accepts no new requests" in message:
        return unavailable(f"The server is shutting down: {message}", "draining")
    # An engine failure is a 500 whatever words its exception holds; other refusals naming an input are the client's.
    if isinstance(exc, GenerationError) and not _engine_failed(message) and _is_request_error(message):
        param = _named_param(message)
        return bad_request(message, param=(renamed or {}).get(param, param), code="invalid_value")
    return OpenAIError(500, f"The model server failed the request: {message}", code="engine_error")


def from_tokenizer(exc: InferenceServerException, param: str) -> OpenAIError:
    """A failed direct call of preprocessing (/tokenize, /detokenize): Triton's gRPC status says whose fault it is."""
    status, message = str(exc.status() or ""), exc.message() or str(exc)
    if "INVALID_ARG" in status:
        if "input tokens (max_input_len)" in message:
            return context_length_exceeded(f"This model's maximum context length was exceeded: {message}", param)
        return bad_request(message, param=param, code="invalid_value")
    if "UNAVAILABLE" in status:
        return unavailable(f"The model server is unavailable: {message}",
                           "draining" if SHUTTING_DOWN in message else "triton_unavailable")
    return OpenAIError(500, f"The model server failed the request: {message}", code="engine_error")


# A request the engine failed while generating: the CPU llm model's words, and tensorrt_llm's (fillTritonResponse).
_ENGINE_FAILURES = ("the engine failed while generating this request", "Executor failed process requestId")
# The beginnings of preprocessing's INVALID_ARG messages that the front door's own validation does not already
# catch first (serving/chat.py, serving/request_params.py): a client's mistake, so 400. The engine's refusals of a
# guide it cannot compile, and the GPU layout's of what TensorRT-LLM lacks (top_logprobs), name their input.
_REQUEST_ERROR_MARKS = ("messages", "conversation", "text_input", "max_tokens", "min_tokens", "temperature", "top_p",
                        "top_k", "seed", "stop", "must be", "is not valid", "penalty", "min_p", "top_logprobs",
                        "return_log_probs", "num_return_sequences", "guided_decoding", "schema", "regex", "grammar",
                        "structural_tag", "tools", "tool_call")
# The contract's input names in those messages → the OpenAI parameter the client sent.
_PARAMS = (("structural_tag", "tools"), ("tool_call", "messages"), ("tools", "tools"),
           ("guided_decoding", "response_format"), ("schema", "response_format"), ("top_logprobs", "top_logprobs"),
           ("min_p", "min_p"), ("num_return_sequences", "n"), ("repetition_penalty", "repetition_penalty"),
           ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty"))


def _engine_failed(message: str) -> bool:
    return any(mark in message for mark in _ENGINE_FAILURES)


def _is_request_error(message: str) -> bool:
    return any(mark in message for mark in _REQUEST_ERROR_MARKS)


def _named_param(message: str) -> str | None:
    return next((param for mark, param in _PARAMS if mark in message), None)
