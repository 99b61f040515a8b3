"""What the served engine's process holds beyond its weights and KV pool (issue 29's goal: ≤ 250 MB more)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Tracing and compiling machinery: a process that only loads an engine and runs it needs none of it, and importing
# it costs ~70 MB (torch._dynamo ~35, sympy with torch.fx's symbolic shapes ~35), each served instance.
TRACERS = ("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes", "sympy")


def test_loading_and_running_an_engine_imports_no_tracer(int4_engine, tiny_checkpoint):
    """A fresh interpreter loads the default variant's kind of engine (its compiled step included), serves a plain
    and a guided request through the engine with the serving modules the llm imports, and has imported none of
    ``TRACERS``. Each used to come in on loading (nn.Embedding's init and ``to_empty`` on the meta device run Python
    reference kernels, torch._refs, that import them on first use), and again with the first guide (transformers'
    AutoTokenizer: +130 MB)."""
    script = textwrap.dedent(f"""
        import json, sys, threading
        from pathlib import Path
        from cpu_engine import EngineLimits, GenerationRequest, LLMEngine, SamplingParams, load_engine
        # The llm's own imports, but those that need Triton's stub (triton_io, llm_metrics):
        import serving.cancel_watch, serving.drain, serving.early_stops, serving.guides, serving.health
        import serving.queue_full, serving.request_params, serving.sequence_output, serving.text

        loaded = load_engine(Path({str(int4_engine)!r}))
        assert loaded.decode.startswith("compiled"), loaded.decode
        done = threading.Event()
        tokens = []
        def on_event(ev):
            tokens.append(ev.token_id)
            if ev.finish_reason is not None:
                done.set()
        limits = EngineLimits.from_build(loaded.build_config, max_queue_size=4)
        engine = LLMEngine(loaded.model, limits, on_event=on_event, dtype=loaded.compute_dtype).start()
        engine.submit(GenerationRequest("r", list(range(3, 40)), 8, SamplingParams(min_tokens=8), end_id=0))
        assert done.wait(120)
        done.clear()
        guide = serving.guides.GuideCompiler({str(tiny_checkpoint)!r}, loaded.model.args.vocab_size, ValueError)
        engine.submit(GenerationRequest("g", list(range(3, 40)), 8, end_id=0, guide=guide("json", "")))
        assert done.wait(120)
        engine.shutdown(timeout=30)
        print(json.dumps({{"tokens": len(tokens), "modules": sorted(sys.modules)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["tokens"] >= 9  # 8, then the guided one's (it may end early: a whole JSON value)
    imported = sorted({t for m in result["modules"] for t in TRACERS if m == t or m.startswith(t + ".")})
    assert imported == [], f"the engine's process imported tracing machinery: {imported}"
