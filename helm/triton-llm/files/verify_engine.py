#!/usr/bin/env python3
"""Refuse to start the server on an engine that does not fit this deployment (standard library only).

Runs as an init container before tritonserver. Checks, with one line per problem:
  - the engine directory holds config.json (TensorRT-LLM's engine schema; the CPU engine writes the same);
  - its mapping (tp_size x pp_size = world_size) is what the pod's GPU count was computed from;
  - its quant_algo is the expected one;
  - the engine manifest (builders/trtllm/manifest.py) exists, and its tp/pp, quant_algo and compute capability
    agree;
  - with --verify-files, config.json's sha256 and every rank*.engine's size are the manifest's (a truncated
    copy or an engine from another build is caught before a multi-minute load fails obscurely).
The GPU image's entry point then checks the manifest against the runtime itself (TensorRT-LLM version, GPU).
With --wait-seconds it first waits for config.json (and the manifest) to appear, e.g. while a build Job runs.
Exit 0: fine. Exit 2: the engine does not fit (the message says how). Exit 3: no engine appeared in time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path


def find_key(obj, key):
    """First value of `key` anywhere in nested dicts/lists (breadth-first), or None."""
    queue = [obj]
    while queue:
        cur = queue.pop(0)
        if isinstance(cur, dict):
            if key in cur:
                return cur[key]
            queue.extend(cur.values())
        elif isinstance(cur, list):
            queue.extend(cur)
    return None


def norm_algo(value) -> str:
    return "NONE" if value in (None, "", "none", "None", "null") else str(value).upper()


def norm_cc(value) -> str:
    """8.9, "8.9", "sm89", "89", [8, 9] -> "8.9"."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{int(value[0])}.{int(value[1])}"
    s = str(value).strip().lower().removeprefix("sm_").removeprefix("sm")
    if "." in s:
        major, minor = s.split(".", 1)
        return f"{int(major)}.{int(minor)}"
    if s.isdigit() and len(s) >= 2:
        return f"{int(s[:-1])}.{int(s[-1])}"
    return s


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wait_for(paths: list[Path], seconds: float) -> list[Path]:
    deadline = time.monotonic() + seconds
    last_note = 0.0
    while True:
        missing = [p for p in paths if not p.is_file()]
        if not missing or time.monotonic() >= deadline:
            return missing
        if time.monotonic() - last_note >= 30:
            print(f"verify-engine: waiting for {', '.join(map(str, missing))}", flush=True)
            last_note = time.monotonic()
        time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))


def verify(args: argparse.Namespace) -> list[str]:
    engine = Path(args.engine_dir)
    config_path = engine / "config.json"
    manifest_path = engine / args.manifest if args.manifest else None
    wanted = [config_path] + ([manifest_path] if manifest_path else [])
    missing = wait_for(wanted, args.wait_seconds)
    if missing:
        raise FileNotFoundError(
            f"no engine at {engine}: {', '.join(str(m) for m in missing)} missing"
            + (f" after waiting {args.wait_seconds:.0f} s" if args.wait_seconds else "")
            + " (check engine.source / engine.subPath, or that the engine-build Job finished)")

    problems: list[str] = []
    try:
        config = json.loads(config_path.read_text())
    except ValueError as e:
        return [f"{config_path} is not valid JSON: {e}"]
    pretrained = config.get("pretrained_config", {})
    mapping = pretrained.get("mapping", {}) or {}
    tp = int(mapping.get("tp_size", 1))
    pp = int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size", tp * pp))
    if world != tp * pp:
        problems.append(f"config.json mapping is inconsistent: world_size {world} != tp_size {tp} x pp_size {pp}")
    if args.expect_tp is not None and tp != args.expect_tp:
        problems.append(f"engine was built with tp_size={tp}, the chart requests gpu.tensorParallel={args.expect_tp}: "
                        f"set gpu.tensorParallel={tp} or rebuild the engine")
    if args.expect_pp is not None and pp != args.expect_pp:
        problems.append(f"engine was built with pp_size={pp}, the chart requests gpu.pipelineParallel={args.expect_pp}: "
                        f"set gpu.pipelineParallel={pp} or rebuild the engine")
    quant = (pretrained.get("quantization") or {}).get("quant_algo")
    if args.expect_quant_algo and norm_algo(quant) != norm_algo(args.expect_quant_algo):
        problems.append(f"engine quant_algo is {norm_algo(quant)}, engine.verify.expectQuantAlgo is "
                        f"{norm_algo(args.expect_quant_algo)}: wrong engine for this deployment")

    if manifest_path:
        try:
            manifest = json.loads(manifest_path.read_text())
        except ValueError as e:
            return problems + [f"{manifest_path} is not valid JSON: {e}"]
        m_quant = find_key(manifest, "quant_algo")
        if m_quant is not None and norm_algo(m_quant) != norm_algo(quant):
            problems.append(f"manifest quant_algo {norm_algo(m_quant)} disagrees with config.json's {norm_algo(quant)}")
        if args.expect_compute_capability:
            cc = find_key(manifest, "compute_capability")
            if cc is None:
                problems.append(f"{manifest_path.name} records no compute_capability; "
                                f"cannot confirm the engine was built for {args.expect_compute_capability}")
            elif norm_cc(cc) != norm_cc(args.expect_compute_capability):
                problems.append(f"engine was built for compute capability {norm_cc(cc)}, this deployment runs on "
                                f"{norm_cc(args.expect_compute_capability)}: TensorRT engines only run on the GPU "
                                f"architecture that built them; rebuild it on this GPU")
        for key, value, wanted in (("tp_size", find_key(manifest, "tp_size"), tp),
                                   ("pp_size", find_key(manifest, "pp_size"), pp)):
            if value is not None and int(value) != wanted:
                problems.append(f"manifest {key}={value} disagrees with config.json's {wanted}")
        if args.verify_files:
            want_sha = manifest.get("config_sha256")
            if not want_sha:
                problems.append(f"--verify-files: {manifest_path.name} has no config_sha256")
            elif sha256(config_path) != str(want_sha).lower():
                problems.append("config.json: sha256 differs from the manifest's config_sha256 "
                                "(the engine and its manifest come from different builds)")
            sizes = manifest.get("engine_files") or {}
            if not sizes:
                problems.append(f"--verify-files: {manifest_path.name} lists no engine_files")
            for rel, size in sorted(sizes.items()):
                path = engine / rel
                if not path.is_file():
                    problems.append(f"{rel}: listed in the manifest, missing from the engine directory")
                elif path.stat().st_size != int(size):
                    problems.append(f"{rel}: {path.stat().st_size} bytes, the manifest says {int(size)} "
                                    f"(truncated or replaced)")
    elif args.expect_compute_capability:
        problems.append("engine.verify.expectComputeCapability needs a manifest (engine.verify.manifestFile)")
    if not problems:
        print(f"verify-engine: {engine} OK (tp={tp}, pp={pp}, quant_algo={norm_algo(quant)}"
              + (f", manifest {manifest_path.name}" if manifest_path else "") + ")", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine-dir", required=True)
    p.add_argument("--manifest", default="manifest.json", help="manifest file name in the engine dir ('' = none)")
    p.add_argument("--expect-tp", type=int)
    p.add_argument("--expect-pp", type=int)
    p.add_argument("--expect-quant-algo", default="")
    p.add_argument("--expect-compute-capability", default="")
    p.add_argument("--verify-files", action="store_true")
    p.add_argument("--wait-seconds", type=float, default=0.0)
    args = p.parse_args(argv)
    try:
        problems = verify(args)
    except FileNotFoundError as e:
        print(f"verify-engine: {e}", file=sys.stderr, flush=True)
        return 3
    for line in problems:
        print(f"verify-engine: {line}", file=sys.stderr, flush=True)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
