"""The decode step compiled ahead of time (cpu_engine/compiled_step.py) against the eager step it stands in for:
built with the engine, loaded with the engine's own weights, the same logits, the same greedy answers, and eager
whenever the package is missing or turned off."""

from __future__ import annotations

import copy
import json
import logging
import shutil
import subprocess
import tempfile

import pytest
import torch

from cpu_engine import compiled_step, cpu_target, load_engine, native
from cpu_engine.kv_cache import KVCache
from tests.test_native_kernels import run_python

def _decode_inputs(loaded, lengths: list[int], block: int = 16):
    """A cache holding prompts of ``lengths`` (prefilled eagerly, each in its own blocks), and the next step's
    tokens, positions and block tables."""
    args = loaded.model.args
    cache = KVCache(args, 64, block, loaded.compute_dtype)
    tables, first = [], 1
    for n in lengths:
        count = -(-(n + 1) // block)
        tables.append(list(range(first, first + count)))
        first += count
    width = max(map(len, tables))
    blocks = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for row, n in enumerate(lengths):
            ids = torch.randint(0, args.vocab_size, (1, n), generator=gen)
            loaded.model(ids, torch.arange(n)[None], blocks[row:row + 1], cache)
    tokens = torch.randint(0, args.vocab_size, (len(lengths), 1), generator=gen)
    return cache, tokens, torch.tensor([[n] for n in lengths]), blocks


def test_engine_build_compiles_the_step_without_its_weights(int4_engine):
    loaded = load_engine(int4_engine)
    compiled = loaded.model.compiled_decode
    assert compiled is not None and loaded.decode == f"compiled ({compiled.path})"
    assert compiled.path.parent.parent.parent == int4_engine / "compiled"
    # Compiled for this machine's CPU target (its x86-64 level, not -march=native), needing flags this CPU has.
    target = json.loads((compiled.path.parent / compiled_step.TARGET_FILE).read_text())
    assert target["march"] == cpu_target.host_target(False).march and cpu_target.runs_here(target["requirements"])
    # No weights in the package: it reads the model's own tensors, in place.
    down_proj = loaded.model.layers[0].mlp.down_proj
    scales_zeros = down_proj.dot_scales_zeros if down_proj.dot else down_proj.scales_zeros  # the decode kernel's
    before = scales_zeros.clone()
    scales_zeros.zero_()
    cache, tokens, positions, blocks = _decode_inputs(loaded, [7, 20])
    with torch.inference_mode():
        zeroed = compiled(tokens, positions, blocks, copy.deepcopy(cache))
        scales_zeros.copy_(before)
        restored = compiled(tokens, positions, blocks, cache)
    assert not torch.equal(zeroed, restored)


@pytest.mark.parametrize("lengths", [[5, 37, 100, 64], [101], [3, 3, 3, 3, 3]])
def test_compiled_step_gives_the_eager_logits_and_cache(int4_engine, lengths):
    """Rows of different histories (each masked to its own), one row, and a full batch with a probe row.
    Compiled with inductor's emulate_precision_casts, so bf16 is rounded where eager rounds it. What may remain is
    the reduction order of a softmax or matmul: one bf16 step of the largest logit (2^-7 of it, bf16 keeping 7
    bits after the leading one) is allowed, and the argmax must not move. Eager at one row runs fused SDPA, the compiled step batched matmuls: same bound."""
    loaded = load_engine(int4_engine)
    compiled = loaded.model.compiled_decode
    cache, tokens, positions, blocks = _decode_inputs(loaded, lengths)
    twin = copy.deepcopy(cache)
    with torch.inference_mode():
        eager = loaded.model(tokens, positions, blocks, cache)
        ours = compiled(tokens, positions, blocks, twin)
    scale = eager.abs().amax(-1, keepdim=True)
    assert ((ours - eager).abs() <= scale * 2 ** -7).all(), (ours - eager).abs().max()
    assert torch.equal(ours.argmax(-1), eager.argmax(-1))
    for (k, v), (k2, v2) in zip(cache.layers, twin.layers):  # this step's keys and values written alike
        assert torch.allclose(k, k2, rtol=2 ** -7, atol=1e-3) and torch.allclose(v, v2, rtol=2 ** -7, atol=1e-3)


def test_missing_or_disabled_package_runs_eager_and_says_why(int4_engine, tmp_path, monkeypatch, caplog):
    copied = shutil.copytree(int4_engine, tmp_path / "engine", ignore=shutil.ignore_patterns("compiled"))
    with caplog.at_level(logging.WARNING, logger="cpu_engine.engine_dir"):
        loaded = load_engine(copied)
    assert loaded.model.compiled_decode is None
    assert loaded.decode.startswith("eager: no compiled decode step") and "builders kernels" in loaded.decode
    assert "decode steps run eager" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cpu_engine.engine_dir"):  # as the builder that compiles it loads
        assert load_engine(copied, compiled_decode=False).decode == "eager: loaded without the compiled step"
    assert "decode steps run eager" not in caplog.text
    monkeypatch.setenv(compiled_step.EAGER_ENV, "eager")
    assert load_engine(int4_engine).decode == f"eager: {compiled_step.EAGER_ENV}=eager"


def test_without_the_cpp_kernels_the_package_runs_through_torchs_loader(int4_engine, tmp_path):
    """``LLM_CPU_KERNELS=eager`` (or no compiler): the step is compiled without the kernels' attention, keyed apart
    from the package that calls them, and run by torch's own loader; the same logits as eager in that process."""
    copied = shutil.copytree(int4_engine, tmp_path / "engine", ignore=shutil.ignore_patterns("compiled", "kernels"))
    code = f"""
        import copy, torch
        from builders.cpu_build import compile_decode_step
        from cpu_engine import load_engine, native
        from tests.test_compiled_step import _decode_inputs
        compile_decode_step({str(copied)!r})
        loaded = load_engine({str(copied)!r})
        assert not native.available() and loaded.model.compiled_decode is not None, loaded.decode
        cache, tokens, positions, blocks = _decode_inputs(loaded, [5, 37, 100])
        with torch.inference_mode():
            eager = loaded.model(tokens, positions, blocks, copy.deepcopy(cache))
            ours = loaded.model.compiled_decode(tokens, positions, blocks, cache)
        print(float(((ours - eager).abs() / eager.abs().amax(-1, keepdim=True)).max()))
    """
    done = run_python(code, {"LLM_CPU_KERNELS": "eager"})
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) <= 2 ** -7


def _vector_registers(package) -> set[str]:
    """The widest registers (xmm, ymm, zmm) the package's generated code names."""
    import zipfile

    with zipfile.ZipFile(package) as archive, tempfile.TemporaryDirectory() as scratch:
        [library] = [n for n in archive.namelist() if n.endswith(".so")]
        code = subprocess.run(["objdump", "-d", archive.extract(library, scratch)], capture_output=True, text=True,
                              check=True).stdout
    return {r for r in ("xmm", "ymm", "zmm") if f"%{r}" in code}


def test_a_package_runs_only_on_a_cpu_with_what_it_was_compiled_for(int4_engine, tmp_path):
    """A process kept off AVX-512 (ATEN_CPU_CAPABILITY=avx2, standing in for an AVX2-only node) does not run the
    package of an AVX-512 machine, which would die of an illegal instruction there: it decodes eager and says what
    its CPU lacks. ``--portable`` (what ``make image`` runs), here on the AVX-512 machine, adds the x86-64-v3
    package: ATen's int4 kernel, no AVX-512 register in its code. That one runs on the AVX2 node, with the eager
    logits within the bound above; the AVX-512 machine keeps its own. Without it, it takes the portable one only where
    int4 runs on ATen's kernel: the portable package calls that kernel, on its layout."""
    if cpu_target.host_target(False).march != "x86-64-v4":
        pytest.skip("needs an AVX-512 machine to stand in for a build host unlike the serving node")
    copied = shutil.copytree(int4_engine, tmp_path / "engine")
    on_avx2_node = f"""
        import copy, torch
        from cpu_engine import load_engine
        from tests.test_compiled_step import _decode_inputs
        loaded = load_engine({str(copied)!r})
        print("decode:", loaded.decode)
        if loaded.model.compiled_decode is not None:
            cache, tokens, positions, blocks = _decode_inputs(loaded, [5, 37, 100])
            with torch.inference_mode():
                eager = loaded.model(tokens, positions, blocks, copy.deepcopy(cache))
                ours = loaded.model.compiled_decode(tokens, positions, blocks, cache)
            print("error:", float(((ours - eager).abs() / eager.abs().amax(-1, keepdim=True)).max()))
    """

    def avx2_node() -> dict[str, str]:
        done = run_python(on_avx2_node, {"ATEN_CPU_CAPABILITY": "avx2"})
        assert done.returncode == 0, done.stderr
        return dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith(("decode", "error")))

    before = avx2_node()["decode"]
    assert before.startswith("eager: no compiled decode step built for this CPU") and "needs avx512" in before, before
    from builders.cpu_build import compile_decode_step

    own, portable = compile_decode_step(copied, portable=True)
    assert own == load_engine(copied).model.compiled_decode.path and own.parent.name.startswith("x86-64-v4-")
    assert portable.parent.name.startswith("x86-64-v3-") and portable.parent.parent == own.parent.parent
    assert not json.loads((portable.parent / compiled_step.TARGET_FILE).read_text())["int4_dot"]
    assert "zmm" in _vector_registers(own) and _vector_registers(portable) == {"xmm", "ymm"}
    after = avx2_node()
    assert after["decode"] == f"compiled ({portable})", after
    assert float(after["error"]) <= 2 ** -7
    shutil.rmtree(own.parent)
    without_own = load_engine(copied)
    if native.int4_dot():  # the portable package calls ATen's int4 kernel, whose layout this process does not hold
        assert without_own.model.compiled_decode is None and "needs ATen's int4 layout" in without_own.decode
    else:
        assert without_own.model.compiled_decode.path == portable


def test_only_whole_packages_for_this_cpu_are_candidates(tmp_path, monkeypatch):
    """find() over package folders as a build leaves them: the runnable one needing the most flags wins; a folder
    without its target.json, an unreadable one, a build's scratch folder and a package for flags this CPU lacks
    are passed over, and the warning names what each lacks."""
    config = {"pretrained_config": {}, "build_config": {}}
    root = compiled_step.package_root(tmp_path, config)
    monkeypatch.setattr(cpu_target, "host_flags", lambda: frozenset({"avx", "avx2", "fma"}))
    monkeypatch.setattr(compiled_step.native, "int4_dot", lambda: False)

    def package(name: str, requirements: list[str] | None, int4_dot: bool = False, text: str | None = None) -> None:
        (root / name).mkdir(parents=True)
        (root / name / compiled_step.PACKAGE).write_bytes(b"")
        if requirements is not None or text is not None:
            described = text or json.dumps({"requirements": requirements, "int4_dot": int4_dot})
            (root / name / compiled_step.TARGET_FILE).write_text(described)

    package("x86-64-v3-00000001", ["avx", "avx2"])
    package("x86-64-v3-00000002", ["avx", "avx2", "fma"])
    package("x86-64-v4-00000003", ["avx2", "avx512f"])
    package("x86-64-v3-00000004", ["avx", "avx2", "fma"], int4_dot=True)
    package("x86-64-v3-00000005", None)
    package("x86-64-v3-00000006", None, text="{not json")
    package(".partial-abc", ["avx", "avx2", "fma"])
    found, why = compiled_step.find(tmp_path, config)
    assert found == root / "x86-64-v3-00000002" / compiled_step.PACKAGE and why == ""
    for name in ("00000001", "00000002"):
        shutil.rmtree(root / f"x86-64-v3-{name}")
    found, why = compiled_step.find(tmp_path, config)
    assert found is None and "x86-64-v4-00000003 needs avx512f" in why and "int4 dot-product kernel" in why
    assert "x86-64-v3-00000006: unreadable" in why and ".partial" not in why and "00000005" not in why
    # An int4_awq engine where the dot-product kernel runs holds only its layout: ATen's packages are unfit.
    int4 = {"pretrained_config": {"quantization": {"quant_algo": "W4A16_AWQ"}}, "build_config": {}}
    monkeypatch.setattr(compiled_step.native, "int4_dot", lambda: True)
    monkeypatch.setattr(cpu_target, "host_flags", lambda: frozenset({"avx", "avx2", "fma", "avx512_bf16"}))
    root = compiled_step.package_root(tmp_path, int4)
    package("x86-64-v3-00000007", ["avx", "avx2", "fma"])
    package("x86-64-v3-00000008", ["avx", "avx2", "fma", "avx512_bf16"], int4_dot=True)
    assert compiled_step.find(tmp_path, int4) == (root / "x86-64-v3-00000008" / compiled_step.PACKAGE, "")
    shutil.rmtree(root / "x86-64-v3-00000008")
    found, why = compiled_step.find(tmp_path, int4)
    assert found is None and "x86-64-v3-00000007 needs ATen's int4 layout" in why, why


def test_cpu_flags_are_capped_by_torchs_capability():
    """An AVX-512 CPU whose process runs torch at AVX2 offers only what AVX2 code may use; elsewhere than x86 a
    package needs the very flags it was built with (a token of the whole set)."""
    line = "flags\t\t: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_vnni amx_tile\n"
    assert {"avx512f", "amx_tile"} <= cpu_target.parse_flags(line, "AVX512", x86=True)
    capped = cpu_target.parse_flags(line, "AVX2", x86=True)
    assert {"avx2", "fma"} <= capped and not {f for f in capped if f.startswith(("avx512", "amx"))}
    assert not {"avx", "avx2"} & cpu_target.parse_flags(line, "DEFAULT", x86=True)
    graviton = cpu_target.parse_flags("Features\t: fp asimd sve\n", "DEFAULT", x86=False)
    wider = cpu_target.parse_flags("Features\t: fp asimd sve sve2\n", "DEFAULT", x86=False)
    assert {"fp", "asimd", "sve"} < graviton and not graviton <= wider
    assert cpu_target.parse_flags("processor : 0\n", "AVX2", x86=True) == frozenset()


def test_a_package_of_other_code_is_never_loaded(int4_engine, tmp_path):
    """The key covers the engine's config: the package of one engine does not fit another's shapes."""
    copied = shutil.copytree(int4_engine, tmp_path / "engine")
    config = (copied / "config.json").read_text().replace('"max_batch_size": 4', '"max_batch_size": 5')
    (copied / "config.json").write_text(config)
    assert load_engine(copied).model.compiled_decode is None


def test_real_model_greedy_answers_equal_eager(real_engine_dir, real_checkpoint):
    """The evaluation's fixed questions, all in flight in the engine loop, compiled vs eager decode (the fp32
    engine the suite serves: the same tokens, every one)."""
    from transformers import AutoTokenizer

    from builders.evaluate import QUESTIONS, chat_prompts, end_ids, greedy_answers

    tokenizer = AutoTokenizer.from_pretrained(real_checkpoint, local_files_only=True)
    prompts, ends = chat_prompts(tokenizer, QUESTIONS), end_ids(real_checkpoint, tokenizer)
    loaded = load_engine(real_engine_dir)
    assert loaded.model.compiled_decode is not None
    compiled = greedy_answers(loaded, prompts, ends, 48)
    loaded.model.compiled_decode = None
    assert compiled == greedy_answers(loaded, prompts, ends, 48)


def test_a_tied_head_and_embedding_resolve_by_either_name():
    """torch.export names a tied tensor by either of its names, not always the same one (a bf16 package of the
    default model wanted model.lm_head.weight and was refused, running eager, while the fp32 one wanted
    model.embed_tokens.weight): the package's constants resolve every alias to the one tensor."""
    from cpu_engine.model import ModelArgs, Transformer

    args = ModelArgs(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True)
    model = Transformer(args)
    model.lm_head.weight = model.embed_tokens.weight  # as engine_dir ties them
    config = {"pretrained_config": {}}
    for name in ("model.lm_head.weight", "model.embed_tokens.weight"):
        [(_, tensor)] = compiled_step._constants([name], model, config).items()
        assert tensor.data_ptr() == model.embed_tokens.weight.data_ptr()
