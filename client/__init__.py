"""Typed client SDK for the Triton LLM ensemble (gRPC, sync and asyncio) and the ``python -m client`` CLI.

    from client import Guide, LLMClient, SamplingParams

    with LLMClient("localhost:8001") as llm:
        print(llm.generate("def f(x):", SamplingParams(max_tokens=32)).text)
        stream = llm.stream("import os", SamplingParams(max_tokens=32))
        for delta in stream:
            print(delta, end="", flush=True)
        print(stream.completion.timings)
        print(llm.chat([{"role": "user", "content": "What is the capital of France?"}]).text)
        for choice in llm.generate_n("Once", SamplingParams(n=3, temperature=1.0, seed=1, logprobs=True)):
            print(choice.index, choice.text, [t.logprob for t in choice.logprobs])
        print(llm.generate("A JSON list:", SamplingParams(guide=Guide("json"))).text)
"""

from client.aio import AsyncLLMClient, AsyncTextStream
from client.core import (GUIDE_TYPES, Chunk, Completion, GenerationError, Guide, Health, Message, SamplingParams,
                         ServerUnavailableError, Timings, TokenLogprob, TopLogprob)
from client.sync import LLMClient, TextStream

__all__ = [
    "GUIDE_TYPES",
    "AsyncLLMClient",
    "AsyncTextStream",
    "Chunk",
    "Completion",
    "GenerationError",
    "Guide",
    "Health",
    "LLMClient",
    "Message",
    "SamplingParams",
    "ServerUnavailableError",
    "TextStream",
    "Timings",
    "TokenLogprob",
    "TopLogprob",
]
