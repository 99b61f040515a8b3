"""Typed client SDK for the Triton LLM ensemble (gRPC, sync and asyncio) and the ``python -m client`` CLI.

    from client import LLMClient, SamplingParams

    with LLMClient("localhost:8001") as llm:
        print(llm.generate("def f(x):", SamplingParams(max_tokens=32)).text)
        stream = llm.stream("import os", SamplingParams(max_tokens=32))
        for delta in stream:
            print(delta, end="", flush=True)
        print(stream.completion.timings)
        print(llm.chat([{"role": "user", "content": "What is the capital of France?"}]).text)
"""

from client.aio import AsyncLLMClient, AsyncTextStream
from client.core import (Completion, GenerationError, Health, Message, SamplingParams, ServerUnavailableError,
                         Timings)
from client.sync import LLMClient, TextStream

__all__ = [
    "AsyncLLMClient",
    "AsyncTextStream",
    "Completion",
    "GenerationError",
    "Health",
    "LLMClient",
    "Message",
    "SamplingParams",
    "ServerUnavailableError",
    "TextStream",
    "Timings",
]
