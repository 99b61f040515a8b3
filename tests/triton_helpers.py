"""Helpers of the integration tests: raw tritonclient calls (below the client SDK on purpose) and waiting."""

from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

_DTYPES = {np.dtype(object): "BYTES"}


def make_input(name: str, value, dtype=None) -> grpcclient.InferInput:
    array = np.asarray(value, dtype=dtype)
    triton_dtype = _DTYPES.get(array.dtype) or np_to_triton_dtype(array.dtype)
    tensor = grpcclient.InferInput(name, list(array.shape), triton_dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def text_inputs(prompt: str, max_tokens: int, **optional) -> list[grpcclient.InferInput]:
    """Ensemble inputs with batch dim 1; ``optional`` values are scalars, lists (words) or bools."""
    inputs = [make_input("text_input", [[prompt.encode()]], object), make_input("max_tokens", [[max_tokens]], np.int32)]
    types = {"stream": bool, "exclude_input_in_output": bool, "temperature": np.float32, "top_p": np.float32,
             "top_k": np.int32, "seed": np.uint64, "end_id": np.int32, "pad_id": np.int32, "min_tokens": np.int32,
             "repetition_penalty": np.float32, "presence_penalty": np.float32, "frequency_penalty": np.float32,
             "min_p": np.float32, "return_log_probs": bool, "top_logprobs": np.int32, "num_return_sequences": np.int32}
    for name, value in optional.items():
        if name in ("stop_words", "bad_words"):
            inputs.append(make_input(name, [[w.encode() for w in value]], object))
        elif name in ("embedding_bias_token_ids", "embedding_bias_weights"):
            inputs.append(make_input(name, [value], np.int32 if name.endswith("ids") else np.float32))
        elif isinstance(value, str):  # guided_decoding_guide_type, guided_decoding_guide
            inputs.append(make_input(name, [[value.encode()]], object))
        else:
            inputs.append(make_input(name, [[value]], types[name]))
    return inputs


def stream_request(grpc_url: str, model: str, inputs, timeout: float = 120.0, outputs: list[str] | None = None,
                   request_id: str = ""):
    """Send one request over the gRPC stream API; return (list of response dicts, error or None). ``outputs``:
    the output names to ask for (None: all of them)."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None)
        responses = []
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                return responses, error
            response = result.get_response()
            outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
            if outputs:
                responses.append(outputs)
            if response.parameters["triton_final_response"].bool_param:
                return responses, None
    finally:
        client.stop_stream()
        client.close()


def texts(responses) -> list[bytes]:
    return [r["text_output"].reshape(-1)[0] for r in responses]


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", every: float = 0.05):
    """Poll ``predicate`` until it returns something true, and return that; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


# ---- the shells a newcomer starts from (serving/stub_python.py makes them all work) ----------------------------

SHELLS = ("plain", "venv-activated", "other-python-first")


def other_python() -> str | None:
    """Another interpreter than this one (Debian's, when the venv is pyenv's), or None."""
    return next((exe for exe in ("/usr/bin/python3", "/usr/local/bin/python3")
                 if Path(exe).exists() and not os.path.samefile(exe, sys.executable)), None)


def shell_env(kind: str, tmp_path: Path) -> dict[str, str]:
    """The environment variables that shell ``kind`` (one of SHELLS) sets over the current ones: what
    `source .venv/bin/activate` does, or another Python's python3 first on PATH (skips without one)."""
    if kind == "plain":
        return {}
    if kind == "venv-activated":
        venv_bin = Path(sys.executable).parent
        return {"PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv_bin.parent)}
    other = other_python()
    if other is None:
        pytest.skip("no second Python on this machine")
    (tmp_path / "other-bin").mkdir()
    for name in ("python3", "python"):
        (tmp_path / "other-bin" / name).symlink_to(other)
    return {"PATH": f"{tmp_path / 'other-bin'}{os.pathsep}{os.environ['PATH']}"}
