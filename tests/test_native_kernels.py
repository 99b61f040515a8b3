"""The engine's C++ kernels (cpu_engine/native.py): built with the engine, loaded from next to it, bit-identical to
the eager path they replace (the attention within float32 rounding; int4's decode projection within one bf16
rounding of ATen's int4 kernel), on oneDNN's real int8 kernels (never a ``ref_`` one), and an eager fallback that
computes the same numbers where they cannot be built."""

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


def _kernel_report(engine: Path, isa: str, runs: str, refuse: str, check: str, needs: str, aten: str) -> dict | None:
    """Run a kernel check in its own process (``isa``: "scalar" turns AVX-512 off), with ``engine``'s library
    loaded. Where ``runs`` (an expression) is false, the engine keeps ATen's kernel and the op, called as ``refuse``,
    must refuse and name what it ``needs``: None (a skip on this CPU when native). Elsewhere ``check`` runs with
    ``report = {}`` and prints it, and the report is returned."""
    preamble = f"""
        import torch
        from cpu_engine import native
        assert native.load({str(engine)!r}) is None
        if not {runs}:
            report = {{"runs": False}}
            try:
                {refuse}
            except RuntimeError as exc:
                report["refused"] = str(exc).splitlines()[0]
            print(report)
            raise SystemExit
        report = {{"runs": True}}
    """
    done = run_python(textwrap.dedent(preamble) + textwrap.dedent(check),
                      {"LLM_CPU_KERNELS_ISA": "scalar"} if isa == "scalar" else None)
    assert done.returncode == 0, done.stderr
    report = eval(done.stdout)  # noqa: S307 - our own subprocess's dict literal
    if not report.pop("runs"):
        assert needs in report.pop("refused")
        if isa == "native":
            pytest.skip(f"this CPU has no {needs}: the engine runs ATen's {aten} kernel")
        return None
    assert isa == "native"
    return report


INT4_CASES = ((128, 64, 32), (208, 128, 64), (80, 96, 32), (16, 64, 64), (192, 256, 128))  # (out, in, group)


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_int4_linear_equals_atens_int4_kernel(int8_sq_engine, isa):
    """int4_awq's projection (kernels/int4_linear.cpp) against ATen's int4 kernel on the same weights: odd block
    counts (208 and 80 rows: 13 and 5 blocks of 16), one block, 3 group sizes, and row counts
    around the kernel's 6-row tile. Both compute in float32 and round to bf16, in other orders: the outputs may
    differ by one bf16 rounding where float32's last bits straddle it, and both stay within that of the exact
    product. Prompt steps ([1, T > 1, K]) run the float32 kernel on the same layout: bit for bit ATen's numbers,
    with a few rows (weights dequantised in registers) and more (a block's weights dequantised once). The module then
    holds that one layout, not ATen's too. Without AVX-512 (``LLM_CPU_KERNELS_ISA=scalar``, or a CPU without
    AVX512-BF16) the engine keeps ATen's kernel, and the op says why it cannot run."""
    check = f"""
        from cpu_engine.quant import Int4Linear, int4_group_dequantise
        for out_f, in_f, group in {INT4_CASES!r}:
            torch.manual_seed(out_f)
            weight = torch.randn(out_f, in_f) * 0.05
            state = Int4Linear.quantise(weight, group)
            dot, aten = Int4Linear(in_f, out_f, group), Int4Linear(in_f, out_f, group)
            for linear, use_dot in ((dot, True), (aten, False)):
                linear.load_state_dict(state)
                q = linear._unpacked()
                linear.pack(use_dot)
            assert {{n for n, _ in dot.named_buffers()}} == {{"dot_packed", "dot_scales_zeros"}}
            exact = int4_group_dequantise(q, state["scales"], state["zeros"]).double()  # (q - 8) * scale + zero
            for rows in (1, 5, 6, 7, 8, 9, 16, 27, 64):
                x = torch.randn(rows, in_f).to(torch.bfloat16)
                got, want = dot(x).double(), aten(x).double()
                product = x.double() @ exact.T
                bound = 2 ** -8 * product.abs() + 2 ** -20 * (x.double().abs() @ exact.abs().T)
                prompt = x[None]  # [1, T, K]: a prompt step, on ATen's numbers (quant.Int4Linear) from 2 rows
                same = torch.equal(dot(prompt), aten(prompt)) or rows == 1
                report[(out_f, in_f, group, rows)] = (float((got != want).double().mean()),
                                                      bool(((got - product).abs() <= bound).all()), same)
        print(report)
    """
    refuse = ("torch.ops.llm_cpu.int4_linear(torch.zeros(1, 64, dtype=torch.bfloat16), "
              "torch.zeros(1, 512, dtype=torch.uint8), torch.zeros(1, 2, 2, 16, dtype=torch.bfloat16), 32, 16)")
    report = _kernel_report(int8_sq_engine, isa, "native.int4_dot()", refuse, check, needs="AVX512-BF16", aten="int4")
    if report is None:
        return
    assert len(report) == len(INT4_CASES) * 9
    for case, (differ, within, prompt_on_aten) in report.items():
        assert within and prompt_on_aten, case
        assert differ <= 0.02, (case, differ)  # one bf16 rounding apart, at a few of the outputs at most


INT8_WO_CASES = ((49152, 576), (1003, 64), (576, 1536), (8, 16))  # (out, in): the default's head, a ragged tile


@pytest.mark.parametrize("isa", ["native", "scalar"])
def test_int8_weight_only_tiles_equal_atens_int8pack_mm(int8_sq_engine, isa):
    """The weight-only int8 kernel (kernels/int8_wo_linear.cpp) on its tiled layout against ATen's
    ``_weight_int8pack_mm`` on the plain one: bit for bit, for the rows it gets (decode rows up to int8's dequantising
    threshold; the head's below its tied threshold), with a last tile of 3 outputs and one of 8 rows. The tiled module
    gives back its plain weight (the prompt chunks' dequantised GEMM reads it). Without AVX-512 the engine keeps
    ATen's kernel and the op refuses."""
    check = f"""
        from cpu_engine.quant import INT8_DEQUANT_ROWS, WeightOnlyInt8Linear
        for out_f, in_f in {INT8_WO_CASES!r}:
            torch.manual_seed(out_f)
            linear = WeightOnlyInt8Linear.from_weight(torch.randn(out_f, in_f))
            plain = linear.weight.clone()
            linear.tile()
            assert [n for n, _ in linear.named_buffers()] == ["scales", "tiled_weight"]
            assert torch.equal(linear.int8_weight(), plain)
            for rows in (1, 2, 3, 4, 5, 8, 16, INT8_DEQUANT_ROWS - 1):
                x = torch.randn(rows, in_f).to(torch.bfloat16) * 4
                want = torch._weight_int8pack_mm(x, plain, linear.scales)
                report[(out_f, in_f, rows)] = torch.equal(linear(x[None])[0], want)
        print(report)
    """
    refuse = ("torch.ops.llm_cpu.int8_wo_linear(torch.zeros(1, 16, dtype=torch.bfloat16), "
              "torch.zeros(1, 1, 8, 16, dtype=torch.int8), torch.ones(8, dtype=torch.bfloat16))")
    report = _kernel_report(int8_sq_engine, isa, "native.int8_wo_tiles()", refuse, check, needs="AVX-512",
                            aten="int8")
    if report is None:
        return
    assert len(report) == len(INT8_WO_CASES) * 8
    assert all(report.values()), [case for case, equal in report.items() if not equal]


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
