"""Triton postprocessing: token ids → text, from each token's bytes (spaces and split characters kept)."""

import os
import sys

# Triton's Python stub ignores PYTHONPATH; the launcher sets it to the project and its environment.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from serving.text import decode_ids, token_bytes_table  # noqa: E402
from serving.triton_io import model_parameters, tensor  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.table = token_bytes_table(model_parameters(args)["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = tensor(request, "output_ids")  # [batch, beam, tokens]
            lengths = tensor(request, "sequence_length")  # [batch, beam]
            texts = [decode_ids(self.table, ids[b, 0, : lengths[b, 0]]).encode("utf-8") for b in range(ids.shape[0])]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array(texts, dtype=object).reshape(-1, 1)),
                pb_utils.Tensor("finish_reason", tensor(request, "finish_reason")),
                pb_utils.Tensor("num_input_tokens", tensor(request, "num_input_tokens")),
                pb_utils.Tensor("num_output_tokens", tensor(request, "num_output_tokens")),
            ]))
        return responses
