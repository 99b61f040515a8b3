"""What the front door knows of Triton: the served model id and its limits (read over gRPC, no file of ours, so
it can run in another container), readiness, and the asyncio client that runs the requests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from client import AsyncLLMClient

ENSEMBLE = "ensemble"
PREPROCESSING = "preprocessing"  # called directly, it is the model's tokenizer (builders/triton_config.py)
# The default max_tokens of /v1/completions: OpenAI's documented default for that endpoint.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
HEALTH_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_seq_len: int  # prompt + completion tokens
    max_input_len: int  # prompt tokens
    created: int
    vocab_size: int  # the engine's (logit_bias keys are ids below it)

    @property
    def chat_default_max_tokens(self) -> int:
        """max_tokens when a chat request sends none: the most that every prompt the engine accepts can still get
        (max_seq_len - max_input_len; 256 on the default profile). Static, so no request needs a second trip
        through the tokeniser; ask for more explicitly, up to max_seq_len - prompt tokens."""
        return self.max_seq_len - self.max_input_len


class Backend:
    """Create inside the serving event loop (gRPC's asyncio channel binds to the loop it starts on)."""

    def __init__(self, url: str, served_model_name: str | None = None):
        self.url = url
        self.served_model_name = served_model_name
        self.client = AsyncLLMClient(url, model=ENSEMBLE)
        self._meta = grpcclient_aio.InferenceServerClient(url)
        self.info: ModelInfo | None = None

    async def load_info(self) -> ModelInfo:
        """The served id (``--served-model-name``, else the ensemble's ``served_model_name`` parameter, rendered
        from the profile) and the limits preprocessing enforces. Raises until Triton has loaded the models."""
        ensemble = (await self._meta.get_model_config(ENSEMBLE, as_json=True))["config"]
        preprocessing = (await self._meta.get_model_config("preprocessing", as_json=True))["config"]

        def parameter(config: dict, key: str) -> str | None:
            return config.get("parameters", {}).get(key, {}).get("string_value")

        model_id = self.served_model_name or parameter(ensemble, "served_model_name") or ENSEMBLE
        self.info = ModelInfo(id=model_id, max_seq_len=int(parameter(preprocessing, "max_seq_len")),
                              max_input_len=int(parameter(preprocessing, "max_input_len")), created=int(time.time()),
                              vocab_size=int(parameter(preprocessing, "vocab_size")))
        return self.info

    async def wait_info(self, period_s: float = 0.5) -> ModelInfo:
        while True:
            try:
                return await self.load_info()
            except (InferenceServerException, KeyError, TypeError, ValueError):
                await asyncio.sleep(period_s)

    async def ready(self) -> bool:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                return self.info is not None and await self._meta.is_model_ready(ENSEMBLE)
        except (InferenceServerException, TimeoutError):
            return False

    async def tokenize(self, text_input: str | None, messages: str | None, tools: str | None,
                       template_kwargs: str | None) -> list[int]:
        """The prompt's token ids as the ensemble makes them (a chat through its template): preprocessing's own
        ``input_ids``. Raises InferenceServerException (INVALID_ARG for what the client must fix)."""
        named = {"text_input": text_input, "messages": messages, "tools": tools, "chat_template_kwargs": template_kwargs}
        inputs = [_bytes_input(name, value) for name, value in named.items() if value is not None]
        max_tokens = InferInput("max_tokens", [1, 1], "INT32")
        max_tokens.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        result = await self._meta.infer(PREPROCESSING, [*inputs, max_tokens],
                                        outputs=[InferRequestedOutput("input_ids")])
        return result.as_numpy("input_ids").reshape(-1).tolist()

    async def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids`` (preprocessing's tokenizer). Raises InferenceServerException."""
        tokens = InferInput("token_ids", [1, len(ids)], "INT32")
        tokens.set_data_from_numpy(np.array([ids], dtype=np.int32))
        result = await self._meta.infer(PREPROCESSING, [tokens], outputs=[InferRequestedOutput("detokenized_text")])
        return result.as_numpy("detokenized_text").reshape(-1)[0].decode("utf-8")

    async def close(self) -> None:
        # The server's stop() has already given its requests 5 s to end: a short wait here keeps the front door's
        # exit inside the launcher's kill timer (serving/frontdoor_process.py).
        await self.client.close(timeout_s=2.0)
        await self._meta.close()


def _bytes_input(name: str, text: str) -> InferInput:
    tensor = InferInput(name, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=object))
    return tensor
