"""The engine's gauges relayed on the front door's port, for an inference gateway's endpoint picker (docs/kubernetes.md,
"Behind an inference gateway").

The endpoint picker (EPP) of the Gateway API Inference Extension scrapes ``podIP:<the port it routes to><path>`` with
no credentials and reads queue, running and KV-cache gauges. The routed port is the front door's, whose ``/metrics``
wants the API key and has only ``openai_*``; the gauges are on Triton's metrics port. So, when a path is configured,
the front door answers it without a key with Triton's engine families only, verbatim (``# HELP``/``# TYPE`` lines
and samples, labels untouched): every ``llm_engine_*`` gauge (both layouts) and TensorRT-LLM's ``nv_trt_llm_*``
families (the GPU layout). Nothing else of Triton's exposition is passed on; no metric carries request content.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

#: Families relayed, by name prefix: the llm model's engine gauges and TensorRT-LLM's backend families.
RELAYED_PREFIXES = ("llm_engine_", "nv_trt_llm_")
FETCH_TIMEOUT_S = 2.0
_COMMENT = re.compile(r"^# (?:HELP|TYPE) (\S+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


def engine_families(exposition: str) -> str:
    """The lines of Triton's text exposition that belong to a relayed family, in their order."""
    kept = []
    for line in exposition.splitlines():
        match = _COMMENT.match(line) if line.startswith("#") else _SAMPLE.match(line)
        if match and match.group(1).startswith(RELAYED_PREFIXES):
            kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


class EngineMetricsRelay:
    """``render()``: Triton's engine families now (one fetch per scrape: the EPP scrapes every ~50 ms, Triton's
    exposition is a few kB, and a cache would only add staleness)."""

    def __init__(self, path: str, triton_metrics_url: str):
        if not path.startswith("/") or path.rstrip("/") != path or " " in path:
            raise ValueError(f"engine metrics path {path!r}: an absolute path without a trailing slash, e.g. "
                             "/engine/metrics")
        self.path = path
        self.triton_metrics_url = triton_metrics_url

    def _fetch(self) -> str:
        with urllib.request.urlopen(self.triton_metrics_url, timeout=FETCH_TIMEOUT_S) as answer:
            return answer.read().decode("utf-8", "replace")

    async def render(self) -> bytes:
        """The relayed families; OSError when Triton's metrics port does not answer (a scrape error, never an empty
        page that would read as an idle engine)."""
        return engine_families(await asyncio.to_thread(self._fetch)).encode()
