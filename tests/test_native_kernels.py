"""The engine's C++ kernels (cpu_engine/native.py): built with the engine, loaded from next to it, bit-identical to
the eager path they replace (the attention within float32 rounding; int4's unpacked weights within one bf16
rounding), on oneDNN's real int8 kernels (never a ``ref_`` one), and an eager fallback that computes the same
numbers where they cannot be built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from builders.cpu_build import BuildLimits, build_cpu_engine
from cpu_engine import native
from cpu_engine.engine_dir import load_engine
from cpu_engine.kv_cache import KVCache
from cpu_engine.quant import SmoothQuantLinear
from tests.conftest import TEST_LIMITS

ROOT = Path(__file__).resolve().parents[1]
TINY_PROJECTIONS_PER_STEP = 4  # qkv, o, gate_up, down: at least one layer's worth per step


@pytest.fixture(scope="module")
def int8_sq_engine(tiny_checkpoint, tmp_path_factory) -> Path:
    return build_cpu_engine(tiny_checkpoint, tmp_path_factory.mktemp("engines") / "tiny-int8_sq", variant="int8_sq",
                            limits=BuildLimits(**TEST_LIMITS), calib_samples=4)


@pytest.fixture(scope="module")
def kernels(int8_sq_engine):
    assert native.load(int8_sq_engine) is None
    return torch.ops.llm_cpu


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=300)


def test_the_engine_build_compiles_the_kernels_next_to_the_engine(int8_sq_engine, tmp_path):
    library = native.library_path(int8_sq_engine)
    assert library.is_file() and library.parent.parent == int8_sq_engine / "kernels"
    # A fresh process with an empty cache and no compiler loads them from there: nothing is built at start.
    done = run_python(f"""
        from cpu_engine.engine_dir import load_engine
        print(load_engine({str(int8_sq_engine)!r}).kernels)
    """, env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": "/nonexistent/c++"})
    assert done.returncode == 0, done.stderr
    assert str(library) in done.stdout
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_int8_linear_is_bit_identical_to_the_eager_path(kernels, int8_sq_engine, isa):
    """Every row count the engine sends (decode rows, chunks, a prompt), widths with and without a 16-lane tail,
    fp32 and bf16 activations, outliers and an all-zero row. ``scalar``: the loops CPUs without AVX-512 take."""
    cases = [(rows, in_f, out_f, dtype) for rows in (1, 3, 16, 130) for in_f, out_f in ((64, 96), (100, 37))
             for dtype in (torch.float32, torch.bfloat16)]
    code = f"""
        import torch
        from cpu_engine import native
        from cpu_engine.quant import SmoothQuantLinear
        assert native.load({str(int8_sq_engine)!r}) is None
        failures = []
        for rows, in_f, out_f, dtype in {[(r, i, o, str(d)) for r, i, o, d in cases]!r}:
            torch.manual_seed(rows * in_f)
            dtype = getattr(torch, dtype.removeprefix("torch."))
            linear = SmoothQuantLinear(in_f, out_f)
            w = torch.randn(out_f, in_f) * 0.05
            linear.load_state_dict(SmoothQuantLinear.quantise(w, torch.rand(in_f) * 4 + 0.1, 0.5, w.abs().amax(0)))
            x = torch.randn(rows, in_f) * 3
            x[0, 5] = 80.0  # an outlier channel: one row's scale far from the others'
            if rows > 1:
                x[-1] = 0.0  # an all-zero row: the scale's 1e-8 floor
            x = x.to(dtype)
            fused = torch.ops.llm_cpu.int8_linear(x, linear.inv_smooth, linear.weight, linear.scales)
            eager = linear.eager(x)
            if fused.dtype != eager.dtype or not torch.equal(fused, eager):
                failures.append((rows, in_f, out_f, str(dtype)))
        print(torch.ops.llm_cpu.int8_linear_isa(), failures)
    """
    done = run_python(code, {"LLM_CPU_KERNELS_ISA": "scalar"} if isa == "scalar" else None)
    assert done.returncode == 0, done.stderr
    chosen, failures = done.stdout.strip().split(" ", 1)
    has_avx512 = "avx512bw" in Path("/proc/cpuinfo").read_text()
    assert chosen == ("avx512" if isa == "native" and has_avx512 else "scalar")
    assert failures == "[]"


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_decode_attention_matches_sdpa_over_the_gathered_cache(int8_sq_engine, isa):
    """The compiled decode step's attention (kernels/decode_attention.cpp) against PyTorch's SDPA on the same keys
    gathered and masked, in float32: rows at different positions, blocks out of order, GQA groups of 1, 3 and 12
    (over the AVX-512 path's 8: its portable loops), and a history shorter than a 16-lane chunk."""
    cases = [(rows, heads, kv_heads, dtype) for rows, heads, kv_heads in ((1, 9, 3), (5, 9, 3), (3, 4, 4), (2, 12, 1))
             for dtype in ("float32", "bfloat16")]
    code = f"""
        import torch
        import torch.nn.functional as F
        from cpu_engine import native
        assert native.load({str(int8_sq_engine)!r}) is None
        worst = {{}}
        for rows, heads, kv_heads, dtype in {cases!r}:
            torch.manual_seed(rows * heads)
            dtype, dim, keys = getattr(torch, dtype), 64, 70
            pool = rows * keys + 32
            k_cache, v_cache = (torch.randn(pool, kv_heads, dim).to(dtype) for _ in range(2))
            reads = torch.randperm(pool)[:rows * keys].view(rows, keys)
            positions = torch.randint(0, keys, (rows,))
            positions[0], positions[-1] = keys - 1, 3
            q = torch.randn(rows, heads, dim).to(dtype)
            got = torch.ops.llm_cpu.decode_attention(q, k_cache, v_cache, reads, positions).float()
            k, v = (c[reads].float().transpose(1, 2) for c in (k_cache, v_cache))
            mask = (torch.arange(keys)[None] <= positions[:, None]).view(rows, 1, 1, keys)
            want = F.scaled_dot_product_attention(q.float()[:, :, None], k, v, attn_mask=mask, enable_gqa=True)
            worst[(rows, heads, kv_heads, str(dtype))] = float((got - want[:, :, 0]).abs().max())
        print(worst)
    """
    done = run_python(code, {"LLM_CPU_KERNELS_ISA": "scalar"} if isa == "scalar" else None)
    assert done.returncode == 0, done.stderr
    for (_, _, _, dtype), error in eval(done.stdout).items():  # noqa: S307 - our own subprocess's dict literal
        # float32: summation order only; bfloat16: the output's rounding (values of magnitude < 4, 2^-8 relative)
        assert error < (1e-5 if dtype == "torch.float32" else 2 ** -6), (dtype, error)


@pytest.mark.parametrize("capability,isa", [("avx512", "native"), ("avx512", "scalar"), ("avx2", "native"),
                                            ("default", "native")])
def test_int4_unpack_equals_the_int4_kernels_weights(int8_sq_engine, capability, isa):
    """Prompt steps' int4 weights (kernels/int4_unpack.cpp) against the int4 kernel's own product with the identity,
    for each tile layout ATen can pick (ATEN_CPU_CAPABILITY), last tiles of 16, 32 and 48 rows (208, 96, 112 rows),
    and 3 group sizes: equal within one bf16 rounding (ATen's AVX2 kernel orders its FMAs otherwise); then a prompt
    step's output against the int4 kernel's (the weights' rounding to bf16 apart)."""
    code = f"""
        import torch
        from cpu_engine import native
        from cpu_engine.quant import Int4Linear, _int4_unpack_matches, int4_tiles
        assert native.load({str(int8_sq_engine)!r}) is None
        report = {{"capability": torch.backends.cpu.get_cpu_capability()}}
        tiles = int4_tiles()
        for out_f, in_f, group in ((128, 64, 32), (208, 128, 64), (96, 64, 32), (112, 64, 64), (192, 256, 128)):
            torch.manual_seed(out_f)
            linear = Int4Linear(in_f, out_f, group)
            linear.load_state_dict(Int4Linear.quantise(torch.randn(out_f, in_f) * 0.05, group))
            linear.pack()
            report[(out_f, in_f, group)] = _int4_unpack_matches(linear, tiles)
            x = torch.randn(1, 27, in_f).to(torch.bfloat16)  # a prompt step: [B, T > 1, K]
            want = linear(x).float()
            linear.tiles = tiles
            got = linear(x).float()
            report[("chunk", out_f)] = float((got - want).norm() / want.norm())
        print(report)
    """
    done = run_python(code, {"ATEN_CPU_CAPABILITY": capability,
                             **({"LLM_CPU_KERNELS_ISA": "scalar"} if isa == "scalar" else {})})
    assert done.returncode == 0, done.stderr
    report = eval(done.stdout)  # noqa: S307 - our own subprocess's dict literal
    if report.pop("capability") != capability.upper():
        pytest.skip(f"ATen cannot pick its {capability} kernels on this CPU")
    for case, result in report.items():
        if case[0] == "chunk":  # bf16 weights: 2^-9 relative each, summed with random signs
            assert result < 5e-3, (case, result)
        else:
            assert result is True, case


def _logits(loaded, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits of every position, then one 4-row decode step (rows at different positions)."""
    model = loaded.model
    cache, blocks = KVCache.for_one_sequence(model.args, len(ids) + 1, loaded.compute_dtype)
    with torch.inference_mode():
        prefill = model(torch.tensor([ids]), torch.arange(len(ids))[None], blocks, cache, last_only=False)[0]
        decode = model(torch.tensor([[ids[-1]]] * 4), torch.tensor([[len(ids) - 1 - i] for i in range(4)]),
                       blocks.expand(4, -1), cache)
    return prefill, decode


def test_the_engine_with_kernels_equals_the_engine_without(kernels, int8_sq_engine):
    loaded = load_engine(int8_sq_engine)
    assert loaded.kernels.startswith("C++")
    linears = [m for m in loaded.model.modules() if isinstance(m, SmoothQuantLinear)]
    assert linears and all(m.fused for m in linears) and loaded.model.lm_head in linears
    ids = [3, 17, 42, 8, 99, 5, 61, 23, 7, 70, 12, 1]
    fused = _logits(loaded, ids)
    for m in linears:
        m.fused = False
    eager = _logits(loaded, ids)
    assert all(torch.equal(a, b) for a, b in zip(fused, eager))


def test_without_a_compiler_the_engine_runs_eager_with_the_same_numbers(kernels, int8_sq_engine, tmp_path):
    """An engine directory without its library (copied without ``kernels/``), no compiler and an empty cache:
    it loads, says why it runs eager, and gives the fused engine's prefill logits bit for bit. Its decode step
    attends in ATen ops, which round the scores to bf16 where the kernel keeps float32: within two bf16 steps of
    the largest logit (2^-6 of it: that difference, then the bf16 logits' own rounding)."""
    bare = tmp_path / "engine"
    bare.mkdir()
    for name in ("config.json", "rank0.safetensors"):
        (bare / name).write_bytes((int8_sq_engine / name).read_bytes())
    ids = [3, 17, 42, 8, 99, 5, 61, 23]
    want = [t.tolist() for t in _logits(load_engine(int8_sq_engine), ids)]
    done = run_python(f"""
        import json, logging
        logging.basicConfig(level=logging.WARNING)
        from cpu_engine.engine_dir import load_engine
        from tests.test_native_kernels import _logits
        loaded = load_engine({str(bare)!r})
        print(json.dumps({{"kernels": loaded.kernels, "logits": [t.tolist() for t in _logits(loaded, {ids!r})]}}))
    """, env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": "/nonexistent/c++"})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["kernels"] == "eager"
    assert "run eager PyTorch" in done.stderr and "could not build the C++ kernels" in done.stderr
    assert got["logits"][0] == want[0]
    decode, kernel = torch.tensor(got["logits"][1]), torch.tensor(want[1])
    assert ((decode - kernel).abs() <= kernel.abs().amax(-1, keepdim=True) * 2 ** -6).all()


def onednn_reference_kernels(verbose_log: str) -> list[str]:
    """oneDNN primitives that ran a reference (``ref``) implementation, from ``ONEDNN_VERBOSE`` output: the
    fallback that made a compiled int8 step ~200× slower (qlinear_pointwise → ``ref_int8:any``)."""
    found = []
    for line in verbose_log.splitlines():
        fields = line.split(",")
        if len(fields) > 6 and fields[:3] == ["onednn_verbose", "v1", "primitive"] and fields[3] == "exec":
            if "ref" in fields[6]:
                found.append(f"{fields[5]}: {fields[6]}")
    return found


def test_the_reference_kernel_detector_sees_the_known_fallback():
    line = ("onednn_verbose,v1,primitive,exec,cpu,matmul,ref_int8:any,undef,src:s8::blocked:ab::f0 "
            "wei:s8:a:blocked:ab::f0 dst:f32::blocked:ab::f0,,,16x576:576x960,6.1")
    assert onednn_reference_kernels(line) == ["matmul: ref_int8:any"]


def test_the_decode_path_runs_no_onednn_reference_kernel(kernels, int8_sq_engine):
    """A 1-row and a 16-row decode step of the int8_sq engine under ONEDNN_VERBOSE: the int8 GEMMs do go through
    oneDNN (their lines are there), and no primitive runs a ``ref`` implementation."""
    done = run_python(f"""
        import torch
        from cpu_engine.engine_dir import load_engine
        from cpu_engine.kv_cache import KVCache
        loaded = load_engine({str(int8_sq_engine)!r})
        assert loaded.kernels.startswith("C++"), loaded.kernels
        cache, blocks = KVCache.for_one_sequence(loaded.model.args, 64, loaded.compute_dtype)
        with torch.inference_mode():
            loaded.model(torch.tensor([[5] * 20]), torch.arange(20)[None], blocks, cache)
            for rows in (1, 16):
                loaded.model(torch.tensor([[7]] * rows), torch.full((rows, 1), 20), blocks.expand(rows, -1), cache)
    """, env={"ONEDNN_VERBOSE": "all"})
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    int8_gemms = [line for line in log.splitlines() if ",exec," in line and "src_s8" in line and "wei_s8" in line]
    assert len(int8_gemms) >= 2 * TINY_PROJECTIONS_PER_STEP
    assert onednn_reference_kernels(log) == []
