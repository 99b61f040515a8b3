"""What the front door knows of Triton: the served model id and its limits (read over gRPC, no file of ours, so
it can run in another container), readiness, and the asyncio client that runs the requests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException

from client import AsyncLLMClient

ENSEMBLE = "ensemble"
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

    async def close(self) -> None:
        await self.client.close()
        await self._meta.close()
