#!/usr/bin/env python3
"""What `helm test` checks on a release (standard library only, so it runs in the server image).

  helm_test.py ready  --http HOST:8000              live, ready, ensemble ready; admin APIs refuse without the key
  helm_test.py generate --http HOST:8000 ...         POST /v2/models/<ensemble>/generate -> text_output
  helm_test.py stream --http HOST:8000 ...           POST .../generate_stream (SSE) -> at least one event
  helm_test.py chat --http HOST:8000 ...             POST .../generate with messages (one chat question) -> an answer
  helm_test.py grpc-stream --grpc HOST:8001 ...      the project's client CLI, streaming over gRPC
  helm_test.py openai-chat --openai HOST:9000 ...    the OpenAI front door: GET /v1/models, then one
                                                     POST /v1/chat/completions (Bearer $LLM_API_KEY when set)

Exit 0 when the check passes; otherwise a one-line reason on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


class CheckFailed(Exception):
    pass


def _request(url: str, body: dict | None = None, timeout: float = 60.0,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        raise CheckFailed(f"{url}: {e}") from None


def check_ready(http: str, ensemble: str, retries: int) -> str:
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{ensemble}/ready"):
        for attempt in range(retries + 1):
            status, _ = _request(f"http://{http}{path}", timeout=10)
            if status == 200:
                break
            if attempt == retries:
                raise CheckFailed(f"GET {path} answered {status}, expected 200")
            time.sleep(2)
    # Model control must not be reachable without the admin key.
    status, _ = _request(f"http://{http}/v2/repository/index", body={}, timeout=10)
    if status != 403:
        raise CheckFailed(f"POST /v2/repository/index without the admin key answered {status}, expected 403")
    return "live, ready, ensemble ready; repository API refused without the admin key (403)"


def check_generate(http: str, ensemble: str, prompt: str, max_tokens: int) -> str:
    status, raw = _request(f"http://{http}/v2/models/{ensemble}/generate",
                           {"text_input": prompt, "max_tokens": max_tokens})
    if status != 200:
        raise CheckFailed(f"generate answered {status}: {raw[:300]!r}")
    try:
        out = json.loads(raw)
    except ValueError:
        raise CheckFailed(f"generate answered non-JSON: {raw[:300]!r}") from None
    text = out.get("text_output")
    if not isinstance(text, str):
        raise CheckFailed(f"generate answered without a text_output string: {out}")
    return f"generate: {text!r}"


def check_stream(http: str, ensemble: str, prompt: str, max_tokens: int) -> str:
    status, raw = _request(f"http://{http}/v2/models/{ensemble}/generate_stream",
                           {"text_input": prompt, "max_tokens": max_tokens, "stream": True})
    if status != 200:
        raise CheckFailed(f"generate_stream answered {status}: {raw[:300]!r}")
    events = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:].strip())
            if "error" in event:
                raise CheckFailed(f"generate_stream sent an error event: {event['error']}")
            events.append(event)
    if not events:
        raise CheckFailed(f"generate_stream sent no events: {raw[:300]!r}")
    text = "".join(e.get("text_output", "") for e in events)
    return f"generate_stream: {len(events)} events, {text!r}"


def check_chat(http: str, ensemble: str, question: str, max_tokens: int, expect: str | None) -> str:
    """One chat question, greedy: the model's own chat template and end of turn, through the ensemble."""
    messages = json.dumps([{"role": "user", "content": question}])
    status, raw = _request(f"http://{http}/v2/models/{ensemble}/generate",
                           {"messages": messages, "max_tokens": max_tokens})
    if status != 200:
        raise CheckFailed(f"chat answered {status}: {raw[:300]!r}")
    try:
        out = json.loads(raw)
    except ValueError:
        raise CheckFailed(f"chat answered non-JSON: {raw[:300]!r}") from None
    text, reason = out.get("text_output"), out.get("finish_reason")
    if not isinstance(text, str) or not text.strip():
        raise CheckFailed(f"chat answered without text: {out}")
    if reason not in ("stop", "length"):
        raise CheckFailed(f"chat answered with finish_reason {reason!r}, expected stop or length: {out}")
    if expect and expect.lower() not in text.lower():
        raise CheckFailed(f"chat answer to {question!r} does not contain {expect!r}: {text!r}")
    return f"chat: {question!r} -> {text!r} (finish_reason {reason})"


def check_openai_chat(openai: str, question: str, max_tokens: int, expect: str | None, api_key: str,
                      retries: int) -> str:
    """One chat completion through the OpenAI front door, as any OpenAI client sends it: the model id from
    /v1/models, then POST /v1/chat/completions; the response must have OpenAI's shape."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for attempt in range(retries + 1):  # the front door is ready only once Triton is
        status, _ = _request(f"http://{openai}/health", timeout=10)
        if status == 200:
            break
        if attempt == retries:
            raise CheckFailed(f"GET /health answered {status}, expected 200")
        time.sleep(2)
    status, raw = _request(f"http://{openai}/v1/models", timeout=10, headers=headers)
    if status != 200:
        raise CheckFailed(f"GET /v1/models answered {status}: {raw[:300]!r}"
                          + (" (is LLM_API_KEY the front door's key?)" if status == 401 else ""))
    try:
        model = json.loads(raw)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CheckFailed(f"GET /v1/models answered without a model id: {raw[:300]!r}") from None
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}
    status, raw = _request(f"http://{openai}/v1/chat/completions", body, headers=headers)
    if status != 200:
        raise CheckFailed(f"POST /v1/chat/completions answered {status}: {raw[:300]!r}")
    try:
        out = json.loads(raw)
        choice = out["choices"][0]
        text, reason = choice["message"]["content"], choice["finish_reason"]
        usage = out["usage"]["completion_tokens"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise CheckFailed(f"chat completion is not in OpenAI's shape: {raw[:300]!r}") from None
    if out.get("object") != "chat.completion" or not isinstance(text, str) or not text.strip():
        raise CheckFailed(f"chat completion without text: {out}")
    if reason not in ("stop", "length"):
        raise CheckFailed(f"chat completion with finish_reason {reason!r}, expected stop or length: {out}")
    if expect and expect.lower() not in text.lower():
        raise CheckFailed(f"chat completion for {question!r} does not contain {expect!r}: {text!r}")
    return f"openai-chat: model {model!r}, {question!r} -> {text!r} ({usage} tokens, finish_reason {reason})"


def check_grpc_stream(grpc: str, prompt: str, max_tokens: int, python: str) -> str:
    cmd = [python, "-m", "client", "generate", prompt, "--url", grpc, "--max-tokens", str(max_tokens), "--stream"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise CheckFailed(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return f"gRPC stream: {proc.stdout.strip()!r}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", choices=["ready", "generate", "stream", "chat", "grpc-stream", "openai-chat"])
    p.add_argument("--http", default="localhost:8000")
    p.add_argument("--grpc", default="localhost:8001")
    p.add_argument("--openai", default="localhost:9000", help="openai-chat: the front door's host:port")
    p.add_argument("--ensemble", default="ensemble")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--question", default="What is the capital of France?",
                   help="chat, openai-chat: the user's question")
    p.add_argument("--expect", help="chat, openai-chat: a word the answer must contain (case-insensitive), e.g. Paris")
    p.add_argument("--retries", type=int, default=30,
                   help="ready, openai-chat: readiness attempts 2 s apart before failing")
    p.add_argument("--client-python", default=sys.executable,
                   help="grpc-stream: a Python that can import the project's client package")
    args = p.parse_args(argv)
    try:
        if args.check == "ready":
            msg = check_ready(args.http, args.ensemble, args.retries)
        elif args.check == "generate":
            msg = check_generate(args.http, args.ensemble, args.prompt, args.max_tokens)
        elif args.check == "stream":
            msg = check_stream(args.http, args.ensemble, args.prompt, args.max_tokens)
        elif args.check == "chat":
            msg = check_chat(args.http, args.ensemble, args.question, args.max_tokens, args.expect)
        elif args.check == "openai-chat":
            key = os.environ.get("LLM_API_KEY", "").split(",")[0].strip()  # the Secret may hold several
            msg = check_openai_chat(args.openai, args.question, args.max_tokens, args.expect, key, args.retries)
        else:
            msg = check_grpc_stream(args.grpc, args.prompt, args.max_tokens, args.client_python)
    except CheckFailed as e:
        print(f"FAIL {args.check}: {e}", file=sys.stderr)
        return 1
    print(f"OK {args.check}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
