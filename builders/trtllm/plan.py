"""The build plan: every command of a TensorRT-LLM engine build, with every important flag explicit.

A plan is pure data, made without a GPU and without TensorRT-LLM: ``--dry-run`` prints it, the CPU tests
check it, and :func:`builders.trtllm.build.run_plan` executes it inside the pinned container.

Flags (TensorRT-LLM 1.2 sources, see docs/gpu.md):
- ``convert_checkpoint.py --model_dir --output_dir --dtype --tp_size --pp_size --workers``
  [``--use_weight_only --weight_only_precision int8``] [``--int8_kv_cache`` | ``--fp8_kv_cache``]
- ``quantize.py --model_dir --output_dir --dtype --qformat {fp8,int8_sq,int4_awq,...} [--kv_cache_dtype
  {fp8,int8}] --calib_dataset DIR --calib_size N --calib_max_seq_length N --batch_size N --tp_size --pp_size
  --seed`` (AWQ caps calib_size at 32 itself); a local calibration set is recognised only as a directory
  (``os.path.isdir``), loaded with ``datasets.load_dataset(dir, split="train")["text"]``.
- ``trtllm-build --checkpoint_dir --output_dir --max_batch_size --max_input_len --max_seq_len --max_num_tokens
  --max_beam_width --gemm_plugin --gpt_attention_plugin --use_paged_context_fmha --use_fp8_context_fmha
  --multiple_profiles --kv_cache_type paged --remove_input_padding --context_fmha --tokens_per_block
  --workers``; boolean plugin flags take ``enable``/``disable``. The two context-FMHA flags are passed as
  TensorRT-LLM's builder will set them anyway (``rules.plugin_flags``), so the command, the predicted
  ``config.json`` and the engine agree.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .gpus import GpuSpec, check_variant
from .memory import MemoryBudget, ModelShape, compute_budget
from .pins import CONVERT_SCRIPT, DEFAULT_TRTLLM_SRC, QUANTIZE_SCRIPT, TRITON_IMAGE, TRTLLM_VERSION
from . import rules
from .variants import KV_CACHE_QUANT_ALGO, VARIANTS

#: Offline: calibration reads a local directory, and nothing may reach a model hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class BuildLimits:
    """The engine's limits (trtllm-build flags); the Triton configs are filled from the same numbers."""

    max_batch_size: int = 64
    max_input_len: int = 3072
    max_seq_len: int = 4096
    max_num_tokens: int = 8192
    max_beam_width: int = 1

    def validate(self, max_position_embeddings: int) -> None:
        if self.max_seq_len > max_position_embeddings:
            raise ValueError(f"max_seq_len {self.max_seq_len} exceeds the model's max_position_embeddings "
                             f"{max_position_embeddings}")
        if not 0 < self.max_input_len < self.max_seq_len:
            raise ValueError(f"max_input_len must be in [1, max_seq_len={self.max_seq_len}), got {self.max_input_len}")
        if self.max_num_tokens < self.max_batch_size:
            raise ValueError(f"max_num_tokens ({self.max_num_tokens}) must be ≥ max_batch_size "
                             f"({self.max_batch_size}): every generating sequence needs one token per step")
        if self.max_beam_width != 1:
            raise ValueError("only max_beam_width 1 is supported by this stack (the ensemble decodes beam 0)")


@dataclass(frozen=True)
class Command:
    """One step of the build: what runs, where, with which extra environment."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class BuildPlan:
    checkpoint: Path
    output_dir: Path  # holds checkpoint/ (intermediate), engine/, calibration/, manifest, budget
    variant: str
    gpu: GpuSpec
    shape: ModelShape
    limits: BuildLimits = BuildLimits()
    kv_cache_dtype: str | None = None
    tp_size: int = 1
    pp_size: int = 1
    dtype: str | None = None  # activation dtype; None = the variant's
    workers: int = 1
    calib_size: int = 512
    calib_max_seq_length: int = 512
    multiple_profiles: bool = True
    tokens_per_block: int = 32
    kv_cache_free_gpu_mem_fraction: float = 0.9
    trtllm_src: Path = Path(DEFAULT_TRTLLM_SRC)
    python: str = "python3"  # the interpreter of the container (TensorRT-LLM is installed there)
    seed: int = 1234

    # ---- derived
    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def activation_dtype(self) -> str:
        return self.dtype or VARIANTS[self.variant].dtype

    @property
    def ckpt_dir(self) -> Path:
        return self.output_dir / "checkpoint"

    @property
    def engine_dir(self) -> Path:
        return self.output_dir / "engine"

    @property
    def calib_dir(self) -> Path:
        return self.output_dir / "calibration"

    @property
    def quant_algo(self) -> str | None:
        return VARIANTS[self.variant].quant_algo

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return KV_CACHE_QUANT_ALGO[self.kv_cache_dtype]

    @property
    def gemm_plugin(self) -> str:
        """FP8 GEMMs come from TensorRT itself (plugin off); 16-bit GEMMs use cuBLASLt in the model dtype."""
        return "disable" if self.variant == "fp8" else self.activation_dtype

    @property
    def plugin_flags(self) -> dict[rules.Flag, bool]:
        """use_paged_context_fmha / use_fp8_context_fmha as TensorRT-LLM's builder sets them for this build."""
        return rules.plugin_flags(self.quant_algo, self.kv_cache_quant_algo, self.gpu.compute_capability)[0]

    def budget(self) -> MemoryBudget:
        return compute_budget(self.shape, self.variant, self.gpu, kv_cache_dtype=self.kv_cache_dtype,
                              tp_size=self.tp_size, pp_size=self.pp_size, max_batch_size=self.limits.max_batch_size,
                              max_seq_len=self.limits.max_seq_len, max_num_tokens=self.limits.max_num_tokens,
                              kv_cache_free_gpu_mem_fraction=self.kv_cache_free_gpu_mem_fraction,
                              tokens_per_block=self.tokens_per_block)

    def describe(self) -> dict:
        d = asdict(self)
        d.update(checkpoint=str(self.checkpoint), output_dir=str(self.output_dir), trtllm_src=str(self.trtllm_src),
                 gpu=self.gpu.describe(), shape=asdict(self.shape), quant_algo=self.quant_algo,
                 kv_cache_quant_algo=self.kv_cache_quant_algo, image=TRITON_IMAGE, trtllm_version=TRTLLM_VERSION)
        return d


def make_plan(checkpoint: str | Path, output_dir: str | Path, variant: str, gpu: GpuSpec, **kwargs) -> BuildPlan:
    """Validate everything that can be validated without a GPU, then return the plan.

    Raises :class:`~builders.trtllm.gpus.UnsupportedOnGpu` (compute-capability gate) or ``ValueError``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    kv = kwargs.get("kv_cache_dtype")
    if kv not in (None, "fp8", "int8"):
        raise ValueError(f"kv_cache_dtype must be fp8, int8 or unset, got {kv!r}")
    if kv is not None and VARIANTS[variant].tool == "convert":
        # A quantized KV cache needs calibrated scales; convert_checkpoint.py would fetch its default hub
        # dataset for that. ModelOpt (quantize.py) calibrates from our local text instead.
        raise ValueError(f"a {kv} KV cache needs calibration, which {variant} does not run: use --variant fp8, "
                         "int8_sq or int4_awq with --kv-cache-dtype, or leave the KV cache unquantized")
    check_variant(variant, gpu, kv)
    checkpoint = Path(checkpoint).absolute()
    output_dir = Path(output_dir).absolute()
    shape = kwargs.pop("shape", None) or ModelShape.from_checkpoint(checkpoint)
    limits = kwargs.get("limits", BuildLimits())
    limits.validate(shape.max_position_embeddings)
    tp, pp = kwargs.get("tp_size", 1), kwargs.get("pp_size", 1)
    if tp < 1 or pp < 1:
        raise ValueError("tp_size and pp_size must be ≥ 1")
    if shape.num_attention_heads % tp:
        raise ValueError(f"tp_size {tp} must divide num_attention_heads {shape.num_attention_heads}")
    if shape.num_hidden_layers % pp:
        raise ValueError(f"pp_size {pp} must divide num_hidden_layers {shape.num_hidden_layers}")
    if not 0.0 < kwargs.get("kv_cache_free_gpu_mem_fraction", 0.9) <= 1.0:
        raise ValueError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
    if variant == "bf16" and kwargs.get("dtype") not in (None, "bfloat16"):
        raise ValueError("the bf16 variant is bfloat16 by definition")
    plan = BuildPlan(checkpoint=checkpoint, output_dir=output_dir, variant=variant, gpu=gpu, shape=shape, **kwargs)
    if not plan.plugin_flags["use_paged_context_fmha"] and limits.max_input_len > limits.max_num_tokens:
        # Without paged context FMHA there is no chunked context, and the runtime caps prompts at max_num_tokens.
        raise ValueError(f"TensorRT-LLM builds {variant} with --kv-cache-dtype {kv} without paged context FMHA, so "
                         f"it runs without chunked context and takes prompts of at most max_num_tokens "
                         f"({limits.max_num_tokens}) tokens, but max_input_len is {limits.max_input_len}: pass "
                         f"--max-input-len {limits.max_num_tokens} or --max-num-tokens {limits.max_input_len}")
    return plan


def plan_commands(plan: BuildPlan) -> list[Command]:
    """Checkpoint conversion / quantisation, then trtllm-build. TP/PP are fixed at conversion time."""
    v = VARIANTS[plan.variant]
    src = plan.trtllm_src
    common = ["--model_dir", str(plan.checkpoint), "--output_dir", str(plan.ckpt_dir), "--dtype", plan.activation_dtype,
              "--tp_size", str(plan.tp_size), "--pp_size", str(plan.pp_size)]
    commands: list[Command] = []
    if v.tool == "convert":
        argv = [plan.python, str(src / CONVERT_SCRIPT), *common, "--workers", str(plan.workers)]
        if v.quant_algo == "W8A16":
            argv += ["--use_weight_only", "--weight_only_precision", "int8"]
        commands.append(Command("convert_checkpoint", tuple(argv), dict(OFFLINE_ENV)))
    else:
        argv = [plan.python, str(src / QUANTIZE_SCRIPT), *common, "--qformat", v.qformat or "",
                "--calib_dataset", str(plan.calib_dir), "--calib_size", str(plan.calib_size),
                "--calib_max_seq_length", str(plan.calib_max_seq_length), "--batch_size", "1",
                "--seed", str(plan.seed)]
        if plan.kv_cache_dtype:
            argv += ["--kv_cache_dtype", plan.kv_cache_dtype]
        commands.append(Command("quantize", tuple(argv), dict(OFFLINE_ENV)))
    lim = plan.limits
    en = lambda flag: "enable" if flag else "disable"  # noqa: E731
    build = ["trtllm-build", "--checkpoint_dir", str(plan.ckpt_dir), "--output_dir", str(plan.engine_dir),
             "--max_batch_size", str(lim.max_batch_size), "--max_input_len", str(lim.max_input_len),
             "--max_seq_len", str(lim.max_seq_len), "--max_num_tokens", str(lim.max_num_tokens),
             "--max_beam_width", str(lim.max_beam_width),
             "--gemm_plugin", plan.gemm_plugin, "--gpt_attention_plugin", "auto",
             "--kv_cache_type", "paged", "--tokens_per_block", str(plan.tokens_per_block),
             "--remove_input_padding", "enable", "--context_fmha", "enable",
             "--use_paged_context_fmha", en(plan.plugin_flags["use_paged_context_fmha"]),
             "--use_fp8_context_fmha", en(plan.plugin_flags["use_fp8_context_fmha"]),
             "--multiple_profiles", en(plan.multiple_profiles),
             "--workers", str(min(plan.workers, plan.world_size))]
    commands.append(Command("trtllm-build", tuple(build), dict(OFFLINE_ENV)))
    return commands


def predict_engine_config(plan: BuildPlan) -> dict:
    """The ``config.json`` trtllm-build will write (TensorRT-LLM's engine schema, the fields we read).

    Used by ``--dry-run`` to render the repository before an engine exists; a real build renders from the real
    file, and the layout reads only fields present in both.
    """
    s = plan.shape
    lim = plan.limits
    return {
        "version": TRTLLM_VERSION,
        "pretrained_config": {
            "architecture": s.architecture,
            "dtype": plan.activation_dtype,
            "logits_dtype": "float32",
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden_size,
            "num_hidden_layers": s.num_hidden_layers,
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_key_value_heads,
            "head_size": s.head_dim,
            "intermediate_size": s.intermediate_size,
            "max_position_embeddings": s.max_position_embeddings,
            "hidden_act": "silu",
            "position_embedding_type": "rope_gpt_neox",
            "mapping": {"world_size": plan.world_size, "tp_size": plan.tp_size, "pp_size": plan.pp_size,
                        "cp_size": 1, "gpus_per_node": 8},
            "quantization": {"quant_algo": plan.quant_algo, "kv_cache_quant_algo": plan.kv_cache_quant_algo,
                             "group_size": VARIANTS[plan.variant].group_size or 128,
                             "has_zero_point": False, "pre_quant_scale": plan.variant == "int4_awq",
                             "exclude_modules": None},
        },
        "build_config": {
            "max_input_len": lim.max_input_len,
            "max_seq_len": lim.max_seq_len,
            "max_batch_size": lim.max_batch_size,
            "max_beam_width": lim.max_beam_width,
            "max_num_tokens": lim.max_num_tokens,
            "opt_num_tokens": None,
            "kv_cache_type": "PAGED",
            "plugin_config": {
                "dtype": plan.activation_dtype,
                "gemm_plugin": None if plan.gemm_plugin == "disable" else plan.gemm_plugin,
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "tokens_per_block": plan.tokens_per_block,
                **plan.plugin_flags,
                "multiple_profiles": plan.multiple_profiles,
            },
        },
    }
