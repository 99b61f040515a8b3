"""Build a CPU engine directory from a Hugging Face Llama/Mistral checkpoint."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from cpu_engine import compiled_step, cpu_target, native
from cpu_engine.engine_dir import (CPU_ENGINE_VERSION, DTYPES, WEIGHTS_FILE, engine_variant,
                                   load_engine, read_config)
from cpu_engine.quant import QUANT_ALGOS, bf16_supported, quantise_state_dict

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM"}
VARIANTS = ("fp32", "bf16", "int8_wo", "int8_sq", "int4_awq", "fp8")
AWQ_GROUP_SIZES = (32,)  # TensorRT-LLM defaults to 128, which does not divide 576; on SmolLM2 AWQ at 64 cost +9.4 % perplexity, at 32 +0.04 %


@dataclass(frozen=True)
class BuildLimits:
    """The same limits ``trtllm-build`` takes; the server refuses requests beyond them. ``max_seq_len`` None: the
    model's whole context (its ``max_position_embeddings``), as vLLM and llama-server serve it: the paged KV cache
    (cpu_engine/block_manager.py) costs memory for the tokens held, not for slots × max_seq_len. ``max_input_len``
    None: all of it but one position, for the first generated token."""

    max_batch_size: int = 16
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int = 256

    def resolved(self, max_position_embeddings: int) -> "BuildLimits":
        seq = self.max_seq_len or max_position_embeddings
        limits = replace(self, max_seq_len=seq, max_input_len=self.max_input_len or seq - 1)
        limits.validate(max_position_embeddings)
        return limits

    def validate(self, max_position_embeddings: int) -> None:
        if self.max_seq_len > max_position_embeddings:
            raise ValueError(f"max_seq_len {self.max_seq_len} exceeds the model's max_position_embeddings "
                             f"{max_position_embeddings}")
        if not 0 < self.max_input_len < self.max_seq_len:
            raise ValueError(f"max_input_len must be in [1, max_seq_len); got {self.max_input_len}")
        if self.max_num_tokens <= self.max_batch_size:
            raise ValueError("max_num_tokens must exceed max_batch_size so prompt chunks fit beside decode rows")


def pretrained_config(hf: dict, dtype: str) -> dict:
    """Hugging Face ``config.json`` → TensorRT-LLM ``pretrained_config`` (Llama family)."""
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch}: expected one of {sorted(SUPPORTED_ARCHITECTURES)}")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("only SiLU-gated MLPs without attention/MLP biases are supported (Llama/Mistral)")
    if arch == "MistralForCausalLM" and hf.get("sliding_window") not in (None, 0):
        if hf["sliding_window"] < hf["max_position_embeddings"]:
            raise ValueError("sliding-window attention is not supported by the CPU engine")
    heads = hf["num_attention_heads"]
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = hf.get("rope_theta") or rope.pop("rope_theta", 10000.0)
    rope.pop("rope_theta", None)
    scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    return {
        "architecture": arch,
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_hidden_layers": hf["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads") or heads,
        "head_size": hf.get("head_dim") or hf["hidden_size"] // heads,
        "intermediate_size": hf["intermediate_size"],
        "max_position_embeddings": hf["max_position_embeddings"],
        "hidden_act": "silu",
        "norm_epsilon": hf.get("rms_norm_eps", 1e-5),
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": float(theta),
        "rotary_scaling": scaling,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }


def _hf_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    index = checkpoint / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    state = {}
    for name in tqdm(files, desc="loading checkpoint", unit="file", disable=len(files) == 1):
        state.update(load_file(str(checkpoint / name)))
    return state


def compute_dtype(variant: str) -> str:
    if variant == "fp32":
        return "float32"
    if variant == "bf16" or bf16_supported():
        return "bfloat16"
    return "float32"  # no fast bf16 on this CPU: quantised weights with fp32 activations


def _calibration_model(checkpoint: Path, samples: int, seq_len: int):
    """The full-precision Hugging Face model and local calibration batches (no hub dataset, works offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .calibration import calibration_batches

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32).eval()
    return model, calibration_batches(tokenizer, samples=samples, seq_len=seq_len)


def _calibration_absmax(checkpoint: Path, samples: int, seq_len: int) -> dict[str, torch.Tensor]:
    from cpu_engine.quant import collect_activation_absmax

    model, batches = _calibration_model(checkpoint, samples, seq_len)
    return collect_activation_absmax(model, tqdm(batches, desc="calibrating SmoothQuant", unit="batch"))


def _awq(checkpoint: Path, weights: dict[str, torch.Tensor], pc: dict, samples: int, seq_len: int) -> int:
    """AWQ-scale ``weights`` in place (builders/calibration.py); returns the group size used."""
    from .calibration import apply_awq, awq_statistics

    widths = (pc["hidden_size"], pc["intermediate_size"], pc["num_attention_heads"] * pc["head_size"])
    group_size = next((g for g in AWQ_GROUP_SIZES if all(w % g == 0 for w in widths)), None)
    if group_size is None:
        raise ValueError(f"int4_awq needs input widths {widths} divisible by one of {AWQ_GROUP_SIZES}")
    model, batches = _calibration_model(checkpoint, samples, seq_len)
    stats = awq_statistics(model, batches)
    apply_awq(weights, stats, pc["num_hidden_layers"], group_size)
    return group_size


def build_cpu_engine(checkpoint: str | Path, output_dir: str | Path, variant: str = "fp32",
                     limits: BuildLimits = BuildLimits(), sq_alpha: float = 0.5, calib_samples: int = 64,
                     compile_step: bool = False) -> Path:
    """``compile_step``: also the ahead-of-time compiled decode step (cpu_engine/compiled_step.py, ~1 min for
    SmolLM2 on 2 cores; the CLI does it, tests that only need weights skip it)."""
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    dtype = compute_dtype(variant)
    hf = json.loads((checkpoint / "config.json").read_text())
    pc = pretrained_config(hf, dtype)
    limits = limits.resolved(pc["max_position_embeddings"])
    weights = {}
    for name, tensor in tqdm(_hf_state_dict(checkpoint).items(), desc="loading fp32", unit="tensor"):
        name = name.removeprefix("model.")
        if not (name == "lm_head.weight" and pc["tie_word_embeddings"]):
            weights[name] = tensor.float()
    absmax, build_extra = None, {}
    if variant == "int8_sq":
        absmax = _calibration_absmax(checkpoint, calib_samples, min(256, limits.max_seq_len))
        build_extra = {"smoothquant_alpha": sq_alpha, "calibration_samples": calib_samples}
    if variant == "int4_awq":
        group_size = _awq(checkpoint, weights, pc, calib_samples, min(256, limits.max_seq_len))
        pc["quantization"].update(group_size=group_size, has_zero_point=True, pre_quant_scale=False)
        build_extra = {"calibration_samples": calib_samples}
    # Projections to be quantised stay fp32 until quantisation; everything else takes the compute dtype.
    for name, tensor in weights.items():
        to_quantise = variant in QUANT_ALGOS and name.endswith("_proj.weight")
        weights[name] = tensor.to(torch.float32 if to_quantise else DTYPES[dtype]).contiguous()
    if variant in QUANT_ALGOS:
        weights = quantise_state_dict(weights, variant, absmax, sq_alpha,
                                      pc["quantization"].get("group_size"))
        pc["quantization"]["quant_algo"] = QUANT_ALGOS[variant]
    output_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(output_dir / WEIGHTS_FILE))
    config = {"version": CPU_ENGINE_VERSION, "pretrained_config": pc,
              "build_config": {**asdict(limits), "max_beam_width": 1, "plugin_config": {}, **build_extra},
              "source_checkpoint": str(checkpoint.resolve())}
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    compiled = compile_step and variant not in compiled_step.NOT_COMPILED
    _build_native_kernels(output_dir)  # every variant calls them, and the compiled step is built for them
    if compiled:
        _compile_decode_step(output_dir)
    return output_dir


def compile_decode_step(engine_dir: str | Path, portable: bool = False) -> list[Path]:
    """The engine's decode step compiled ahead of time (cpu_engine/compiled_step.py) next to it for this machine's
    CPU and, with ``portable``, also for any x86-64-v3 CPU (cpu_engine/cpu_target.py: what an image carries for
    nodes unlike the machine that built it), unless those packages are there already."""
    config = read_config(engine_dir)
    variant = engine_variant(config)
    if variant in compiled_step.NOT_COMPILED:
        raise ValueError(f"{variant} engines have no compiled decode step (their projections are a C++ op)")
    native.load(engine_dir)  # the package depends on whether the step can call them (else eager attention)
    targets = [compiled_step.build_target(config)]
    if not cpu_target.runs_here(targets[0].requirements()):  # a VM that hides flags its CPU model implies
        log.warning("this machine lacks %s, which its own CPU target needs: its package will not load here",
                    ", ".join(cpu_target.missing(targets[0].requirements())))
    if portable and not cpu_target.X86:
        print("--portable: x86-64 only; this machine's package is the only one", flush=True)
    elif portable and cpu_target.PORTABLE not in targets:
        if not cpu_target.runs_here(cpu_target.LEVELS[cpu_target.PORTABLE.march]):
            raise ValueError(f"this machine cannot compile for {cpu_target.PORTABLE.march} (no AVX2)")
        targets.append(cpu_target.PORTABLE)
    loaded, paths = None, []
    for target in targets:
        path = compiled_step.package_path(engine_dir, config, target)
        if not compiled_step.built(path):
            if loaded is None:
                print(f"compiling the decode step ahead of time (AOTInductor, ~1 min a CPU target) under "
                      f"{compiled_step.package_root(engine_dir, config)}", flush=True)
            # A portable package calls ATen's int4 kernel: the engine loaded with that layout to trace it.
            if loaded is None or loaded[0] != target.int4_dot:
                loaded = (target.int4_dot, load_engine(engine_dir, compiled_decode=False, int4_dot=target.int4_dot))
            path = compiled_step.build(loaded[1], target, engine_dir)
        paths.append(path)
    return paths


def _compile_decode_step(engine_dir: Path) -> None:
    """Without a compiler the engine still serves: its decode steps run eager (cpu_engine/compiled_step.py)."""
    try:
        compile_decode_step(engine_dir)
    except Exception as exc:  # noqa: BLE001 - inductor's compile errors have no common base; eager still serves
        log.warning("the decode step was not compiled (%s): decode steps will run eager PyTorch", exc)


def _build_native_kernels(engine_dir: Path) -> None:
    """Ahead of time, next to the engine (cpu_engine/native.py): serving then loads them without a compiler. An
    engine without them still serves, through eager PyTorch (native.py says how close its numbers are)."""
    try:
        native.build(engine_dir)
    except (OSError, RuntimeError) as exc:
        log.warning("the C++ kernels were not built (%s): this engine runs eager PyTorch where it would call them "
                    "(decode attention, int8_sq's and int4_awq's projections)", exc)
