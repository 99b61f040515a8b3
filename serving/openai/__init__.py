"""The OpenAI-compatible front door: ``python -m serving openai --triton HOST:PORT`` (docs/openai.md).

A separate asyncio process (FastAPI + uvicorn) in front of Triton's ensemble, reached over gRPC with the
project's own asyncio client: ``protocol`` (OpenAI's request/response schema), ``errors`` (the one error envelope
and the status of every failure), ``backend`` (what the front door reads from Triton), ``streaming`` (a Triton
request as a cancellable task, stop strings), ``server`` (routes, auth, drain, metrics), ``cli``.
"""
