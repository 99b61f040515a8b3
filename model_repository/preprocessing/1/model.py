"""Triton preprocessing: text → token ids, request defaults and validation (INVALID_ARG on bad input)."""

import secrets

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

from serving.drain import PREPROCESSING_GRACE_S, DrainGate
from serving.request_params import check_lengths, check_min_tokens, resolve_sampling
from serving.stub_python import check_stub
from serving.text import to_word_list
from serving.triton_io import (RequestError, error_response, model_parameters, scalar,
                               shutting_down_response, single_row)


def _texts(row) -> list[str]:
    if row is None:
        return []
    try:
        return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in row.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise RequestError(f"stop_words/bad_words must be UTF-8 text: {exc}") from None


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], local_files_only=True)
        self.max_input_len = int(params["max_input_len"])
        self.max_seq_len = int(params["max_seq_len"])
        self.end_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id
        self.gate = DrainGate()

    def execute(self, requests):
        if self.gate.closed_for(PREPROCESSING_GRACE_S):  # the ensemble's entry: nothing new while draining
            return [shutting_down_response() for _ in requests]
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._preprocess(request)))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(exc))
        return responses

    def _words(self, row) -> np.ndarray:
        ids = [self.tokenizer(w, add_special_tokens=False, split_special_tokens=True).input_ids
               for w in _texts(row) if w]
        return to_word_list([w for w in ids if w])[None]

    def _preprocess(self, request):
        raw = single_row(request, "text_input")
        if raw is None or raw.size != 1:
            raise RequestError("text_input must hold exactly one prompt")
        raw = raw.reshape(-1)[0]
        try:
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as exc:
            raise RequestError(f"text_input is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        if not prompt:
            raise RequestError("text_input is empty: send a prompt of at least one character")
        max_tokens = scalar(request, "max_tokens", int)
        if max_tokens is None:
            raise RequestError("max_tokens is required")
        # Text that looks like a control token ("</s>") is text: only the tokenizer's own BOS is special.
        input_ids = self.tokenizer(prompt, split_special_tokens=True).input_ids
        check_lengths(len(input_ids), max_tokens, self.max_input_len, self.max_seq_len)
        min_tokens = scalar(request, "min_tokens", int) or 0
        check_min_tokens(min_tokens, max_tokens)
        sampling = resolve_sampling(scalar(request, "temperature", float), scalar(request, "top_k", int),
                                    scalar(request, "top_p", float))
        seed = scalar(request, "seed", int)
        end_id = scalar(request, "end_id", int)
        pad_id = scalar(request, "pad_id", int)
        stream = scalar(request, "stream", bool)
        exclude_input = scalar(request, "exclude_input_in_output", bool)

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
        ]
