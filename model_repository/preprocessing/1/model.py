"""Triton preprocessing: text or chat messages → token ids, request defaults and validation (INVALID_ARG on bad
input). Chat messages go through serving.chat: the template's markers become control tokens, content stays text.
The ensemble's entry: while draining, and while the llm's queue is full (serving/queue_full.py), it refuses new
requests before tokenising them."""

import secrets
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from serving.chat import ChatEncoder, default_end_id, parse_messages, parse_template_kwargs, parse_tools
from serving.drain import PREPROCESSING_GRACE_S, DrainGate
from serving.health import is_probe
from serving.request_params import (CONTROL_INPUTS, check_lengths, check_min_tokens, embedding_bias, resolve_controls,
                                    resolve_sampling)
from serving.queue_full import QueueFullFlag, entry_refusal
from serving.stub_python import check_stub
from serving.text import to_word_list
from serving.tokenizer import Tokenizer
from serving.triton_io import (RequestError, error_response, model_parameters, scalar,
                               shutting_down_response, single_row)


def _texts(row) -> list[str]:
    if row is None:
        return []
    try:
        return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in row.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise RequestError(f"stop_words/bad_words must be UTF-8 text: {exc}") from None


def _string(request, name: str) -> str | None:
    """An optional one-element STRING input as text, or None when absent."""
    raw = single_row(request, name)
    if raw is None:
        return None
    if raw.size != 1:
        raise RequestError(f"{name} must hold exactly one " + ("prompt" if name == "text_input" else "JSON array"))
    raw = raw.reshape(-1)[0]
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError as exc:
        raise RequestError(f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _bound_for_llm(request) -> bool:
    """An ensemble step asks for the llm's inputs; the front door's /tokenize and /detokenize ask for one output."""
    return "request_output_len" in request.requested_output_names()


def _element(value) -> tuple[object, type]:
    """A control's value and its tensor dtype (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        return value, bool
    if isinstance(value, int):
        return value, np.int32
    if isinstance(value, float):
        return value, np.float32
    return value.encode("utf-8"), object


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        # Not transformers' AutoTokenizer: importing it (and torch) doubled each instance's start.
        self.tokenizer = Tokenizer.from_dir(params["tokenizer_dir"])
        self.max_input_len = int(params["max_input_len"])
        self.max_seq_len = int(params["max_seq_len"])
        self.vocab_size = int(params["vocab_size"])  # the engine's (embedding_bias has one value per entry)
        self.chat = ChatEncoder(self.tokenizer)
        # The end of the assistant's turn (generation_config.json), so chat answers end with finish_reason "stop".
        self.end_id = default_end_id(self.chat, params["tokenizer_dir"])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id
        self.gate = DrainGate()
        self.llm_queue_full = QueueFullFlag()
        if self.llm_queue_full.problem:
            pb_utils.Logger.log_warn(self.llm_queue_full.problem)
        self.llm_instances = int(params.get("llm_instances", "1"))
        self._next_through = 0.0  # while the llm is full, one request a second still goes to it
        self.queue_full_message = entry_refusal(int(params.get("llm_max_queue_size", "0")))

    def execute(self, requests):
        draining = self.gate.closed_for(PREPROCESSING_GRACE_S)  # the ensemble's entry: nothing new while draining
        llm_full = self.llm_queue_full.all_full(self.llm_instances) and not self._one_through()
        responses = []
        for request in requests:
            if draining and not is_probe(request.request_id()):  # a liveness probe answers while draining too
                responses.append(shutting_down_response())
                continue
            # The llm would refuse it: say so now, at a fraction of the cost (a probe is never refused there).
            if llm_full and not is_probe(request.request_id()) and _bound_for_llm(request):
                responses.append(error_response(RequestError(self.queue_full_message),
                                                pb_utils.TritonError.UNAVAILABLE))
                continue
            try:
                ids = single_row(request, "token_ids")
                outputs = self._preprocess(request) if ids is None else self._detokenize(ids)
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(exc))
        return responses

    def _one_through(self) -> bool:
        """True once a second: a byte left "full" by an llm stub that died must not refuse everything. That request
        reaches the llm, whose restarted stub clears its byte; a full llm refuses it, as before the entry refused."""
        now = time.monotonic()
        if now < self._next_through:
            return False
        self._next_through = now + 1.0
        return True

    def _detokenize(self, ids: np.ndarray) -> list:
        """A direct call with ``token_ids`` (the front door's /detokenize): their text, and nothing else."""
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise RequestError(f"token_ids must be token ids in [0, {self.vocab_size}), got min {ids.min()} max "
                               f"{ids.max()}")
        text = self.tokenizer.decode([int(i) for i in ids.reshape(-1)])
        return [pb_utils.Tensor("detokenized_text", np.array([[text.encode("utf-8")]], dtype=object))]

    def _words(self, row) -> np.ndarray:
        ids = [self.tokenizer.encode(w, add_special_tokens=False, split_special_tokens=True) for w in _texts(row) if w]
        return to_word_list([w for w in ids if w])[None]

    def _input_ids(self, request) -> tuple[list[int], str]:
        """The prompt's ids from exactly one of text_input and messages, and how errors name the prompt."""
        prompt, messages = _string(request, "text_input"), _string(request, "messages")
        if (prompt is None) == (messages is None):
            raise RequestError("send exactly one of text_input (a prompt) and messages (a chat as a JSON array "
                               "of {role, content}), " + ("not both" if prompt is not None else "got neither"))
        tools, template_kwargs = _string(request, "tools"), _string(request, "chat_template_kwargs")
        if messages is not None:
            return (self.chat.encode(parse_messages(messages), parse_tools(tools), parse_template_kwargs(template_kwargs)),
                    "conversation (after the chat template)")
        if tools is not None or template_kwargs is not None:
            raise RequestError("tools and chat_template_kwargs go with messages (a chat), not with text_input")
        if not prompt:
            raise RequestError("text_input is empty: send a prompt of at least one character")
        # Text that looks like a control token ("</s>") is text: only the tokenizer's own BOS is special.
        return self.tokenizer.encode(prompt, split_special_tokens=True), "prompt"

    def _preprocess(self, request):
        input_ids, what = self._input_ids(request)
        max_tokens = scalar(request, "max_tokens", int)
        if max_tokens is None:
            raise RequestError("max_tokens is required (-1: up to the end of the model's context)")
        if max_tokens == -1:  # as vLLM without max_tokens: the rest of the context
            max_tokens = max(self.max_seq_len - len(input_ids), 1)
        check_lengths(len(input_ids), max_tokens, self.max_input_len, self.max_seq_len, what)
        min_tokens = scalar(request, "min_tokens", int) or 0
        check_min_tokens(min_tokens, max_tokens)
        sampling = resolve_sampling(scalar(request, "temperature", float), scalar(request, "top_k", int),
                                    scalar(request, "top_p", float))
        seed = scalar(request, "seed", int)
        end_id = scalar(request, "end_id", int)
        pad_id = scalar(request, "pad_id", int)
        stream = scalar(request, "stream", bool)
        exclude_input = scalar(request, "exclude_input_in_output", bool)
        controls = resolve_controls({name: scalar(request, name, cast) for name, cast in CONTROL_INPUTS.items()})

        def one(value, dtype):
            return np.array([[value]], dtype=dtype)

        return [
            pb_utils.Tensor("input_ids", np.array([input_ids], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", one(len(input_ids), np.int32)),
            pb_utils.Tensor("request_output_len", one(max_tokens, np.int32)),
            pb_utils.Tensor("end_id", one(self.end_id if end_id is None else end_id, np.int32)),
            pb_utils.Tensor("pad_id", one(self.pad_id if pad_id is None else pad_id, np.int32)),
            pb_utils.Tensor("stop_words_list", self._words(single_row(request, "stop_words"))),
            pb_utils.Tensor("bad_words_list", self._words(single_row(request, "bad_words"))),
            pb_utils.Tensor("runtime_top_k", one(sampling.top_k, np.int32)),
            pb_utils.Tensor("runtime_top_p", one(sampling.top_p, np.float32)),
            pb_utils.Tensor("temperature", one(sampling.temperature, np.float32)),
            pb_utils.Tensor("random_seed", one(secrets.randbits(63) if seed is None else seed, np.uint64)),
            pb_utils.Tensor("min_tokens", one(min_tokens, np.int32)),
            pb_utils.Tensor("streaming", one(bool(stream), bool)),
            pb_utils.Tensor("exclude_input_in_output", one(True if exclude_input is None else exclude_input, bool)),
            pb_utils.Tensor("embedding_bias", embedding_bias(single_row(request, "embedding_bias_token_ids"),
                                                             single_row(request, "embedding_bias_weights"),
                                                             self.vocab_size)),
        ] + [pb_utils.Tensor(name, one(*_element(value))) for name, value in vars(controls).items()]
