"""Peer: llama.cpp through llama-cpp-python (its own venv, bench/llama_cpp_setup.sh), one request at a time, on
GGUF files written from the same checkpoint (F32, F16; Q8_0 and Q4_1 by llama.cpp's own quantizer)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

from bench.engine_bench.models import BenchModel, cached, file_digest, say, write_stamp
from bench.engine_bench.noise import MONITOR, noise_fields
from bench.engine_bench.options import PROJECT_ROOT, Options

LLAMA_CPP_VENV = PROJECT_ROOT / "build" / "tools" / "llama-cpp"
LLAMA_QUANTISED = ("q8_0", "q4_1")  # written by llama.cpp's quantizer from the F32 export


def llama_cpp_python() -> tuple[Path | None, str]:
    py = LLAMA_CPP_VENV / "bin" / "python"
    script = PROJECT_ROOT / "bench" / "llama_cpp_setup.sh"
    r = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip() or "llama-cpp-python is not installed") + \
            " — run bench/llama_cpp_setup.sh (builds llama-cpp-python from its sdist, ~4-6 min)"
    return py, ""


def llama_job(py: Path, job: dict, timeout: float = 1800) -> dict:
    out = Path(job.get("_out") or (Path("/tmp") / f"llama-cpp-{os.getpid()}.json"))
    job = {k: v for k, v in job.items() if k != "_out"}
    env = {**os.environ, "OMP_NUM_THREADS": str(job.get("threads", 2))}
    r = subprocess.run([str(py), str(PROJECT_ROOT / "bench" / "llama_cpp_peer.py"), str(out)],
                       input=json.dumps(job), capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def prepare_ggufs(model: BenchModel, py: Path, opts: Options) -> dict[str, Path]:
    from bench.gguf_export import export_gguf

    out_dir = opts.work_dir / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    src = file_digest(model.checkpoint / "model.safetensors", PROJECT_ROOT / "bench" / "gguf_export.py")
    paths = {}
    f32 = out_dir / f"{model.name}-f32.gguf"
    for t in opts.gguf_types:
        path = out_dir / f"{model.name}-{t}.gguf"
        stamp = {"type": t, "inputs": src, "quantizer": "llama.cpp" if t in LLAMA_QUANTISED else "gguf"}
        if not (path.exists() and cached(path, stamp)):
            say(f"writing {path.name}")
            if t in LLAMA_QUANTISED:  # llama.cpp's own quantizer, from the F32 file
                if not (f32.exists() and cached(f32, {"type": "f32", "inputs": src, "quantizer": "gguf"})):
                    export_gguf(model.checkpoint, f32, "f32", name=model.name)
                    write_stamp(f32, {"type": "f32", "inputs": src, "quantizer": "gguf"})
                llama_job(py, {"op": "quantize", "src": str(f32), "dst": str(path), "ftype": t,
                                "threads": opts.threads})
            else:
                export_gguf(model.checkpoint, path, t, name=model.name)
            write_stamp(path, stamp)
        paths[t] = path
    return paths


def bench_llama_cpp(model: BenchModel, gguf_type: str, path: Path, py: Path, opts: Options) -> tuple[list[dict], list[list[int]], dict]:
    k = max(opts.b1_reps, opts.hf_requests)
    job = {"op": "run", "gguf": str(path), "threads": opts.threads, "n_ctx": 1024, "new_tokens": opts.new_tokens,
           "warmup": 1, "requests": [{"ids": ids} for ids in model.prompt_ids[:k]], "tokenize": model.prompts}
    mark = MONITOR.start()
    res = llama_job(py, job)
    noise = MONITOR.stop(mark)
    reps = []
    for r in res["results"]:
        t = r["times"]
        reps.append({"ttft_s": t[0] - r["start"], "decode_tok_s": (len(t) - 1) / (t[-1] - t[0]),
                     "total_s": t[-1] - r["start"], "tokens": len(r["tokens"])})
    base = {"model": model.name, "peer": "llama.cpp", "variant": gguf_type.upper(), "load_s": res["load_s"],
            "rss_mb": res["rss_mb"], **noise_fields(noise)}
    total_tokens = sum(r["tokens"] for r in reps)
    records = [
        {**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps[: opts.b1_reps]),
         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in reps[: opts.b1_reps]), "reps": reps},
        {**base, "mode": "streams", "streams": 1, "agg_tok_s": total_tokens / sum(r["total_s"] for r in reps),
         "tokens": total_tokens, "wall_s": sum(r["total_s"] for r in reps),
         "ttft_p50_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps)},
    ]
    tok_match = sum(a == b for a, b in zip(res["tokenized"], model.prompt_ids))
    info = {"version": res["version"], "system_info": res["system_info"],
            "tokenizer_agreement": {"exact": tok_match, "of": len(model.prompt_ids)}}
    return records, [r["tokens"] for r in res["results"]], info
