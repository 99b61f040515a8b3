"""TensorRT-LLM's own engine-builder rules, as one table: what it refuses on which GPUs, and which plugin flags
it sets whatever ``trtllm-build`` was told. The GPU gate (``gpus.check_variant``), the build plan and its
predicted engine ``config.json`` (``plan.py``), the memory budget (``memory.py``) and the rendered
``tensorrt_llm`` config (``layout.py``) all read these rules, so what we print is the engine that gets built.

Read from TensorRT-LLM's sources (stored copies of NVIDIA/TensorRT-LLM; versions in docs/gpu.md, "The builder's
rules"). ``quant_algo`` names are TensorRT-LLM's ``QuantAlgo``; build() tests ``QuantMode`` bits, which
``QuantMode.from_quant_algo`` (``tensorrt_llm/quantization/mode.py``) derives from them: the sets below are
the algos for which those tests are true. Ours: W8A16 (int8_wo), W4A16_AWQ (int4_awq), W8A8_SQ_PER_CHANNEL
(int8_sq), FP8 (fp8). The plan always passes ``--context_fmha enable``, so build()'s branch for context FMHA
off is not encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

CC = tuple[int, int]
Algo = str | None  # a QuantAlgo name; None: not quantized
Flag = Literal["use_paged_context_fmha", "use_fp8_context_fmha"]

BUILD = "tensorrt_llm/builder.py: build"
SUPPORT_MATRIX = "TensorRT-LLM support matrix, Precision (docs/source/reference/support-matrix.md)"
#: quant_algo values build() counts as "the fp8 quantization workflow" (its FP8 context FMHA branch)
FP8_WORKFLOW: frozenset[Algo] = frozenset({"FP8", "W4A8_AWQ", "NVFP4"})
#: is_int8_weight_only() or is_int4_weight_only() (W4A8_AWQ too: from_quant_algo makes it INT4 weight-only)
WEIGHT_ONLY: frozenset[Algo] = frozenset({"W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W4A16_GPTQ", "W8A16_GPTQ"})
#: has_act_and_weight_quant(): INT8 weights and activations
SMOOTHQUANT: frozenset[Algo] = frozenset({
    "W8A8_SQ_PER_CHANNEL", "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
    "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN"})
#: has_per_channel_scaling() or has_per_token_dynamic_scaling(), less SmoothQuant (refused first)
PER_CHANNEL_OR_TOKEN: frozenset[Algo] = frozenset({"FP8_PER_CHANNEL_PER_TOKEN"})
FP8: frozenset[Algo] = frozenset({"FP8"})
INT8: frozenset[Algo] = frozenset({"INT8"})
#: get_sm_version() >= 100 and get_sm_version() < 120 in build(): Blackwell data-center parts (B200 is 10.0)
SM100_RANGE: tuple[CC, CC] = ((10, 0), (12, 0))


@dataclass(frozen=True)
class BuilderRule:
    """One rule: on compute capability ``cc_from`` ≤ cc < ``cc_below``, for a checkpoint whose ``quant_algo`` /
    ``kv_cache_quant_algo`` match (``None`` sets: any), TensorRT-LLM either refuses (``refuses``: what) or sets a
    plugin flag (``sets``), the latter only while ``while_flag`` holds at that point of build()."""

    source: str  # the TensorRT-LLM file and function (or document) it was read from
    says: str  # what that source says, in its own words where it has any
    refuses: Literal["gpu", "weights", "kv_cache"] | None = None
    sets: tuple[Flag, bool] | None = None
    cc_from: CC = (0, 0)
    cc_below: CC | None = None
    weights_in: frozenset[Algo] | None = None
    weights_not_in: frozenset[Algo] = frozenset()
    kv_in: frozenset[Algo] | None = None
    kv_not_in: frozenset[Algo] = frozenset()
    while_flag: tuple[Flag, bool] | None = None

    def __post_init__(self) -> None:
        if (self.refuses is None) == (self.sets is None):
            raise ValueError("a builder rule either refuses or sets a flag")

    def applies(self, quant_algo: Algo, kv_algo: Algo, cc: CC, flags: Mapping[Flag, bool]) -> bool:
        return (self.cc_from <= cc and (self.cc_below is None or cc < self.cc_below)
                and (self.weights_in is None or quant_algo in self.weights_in)
                and quant_algo not in self.weights_not_in
                and (self.kv_in is None or kv_algo in self.kv_in)
                and kv_algo not in self.kv_not_in
                and (self.while_flag is None or flags[self.while_flag[0]] == self.while_flag[1]))


_NOT_SM100 = "INT8/INT4 quantization is not supported on SM>=100."
_FP8_CTX_OFF = "FP8 Paged Context FMHA is disabled because FP8 context FMHA is disabled."

#: The table. Flag rules are in build()'s order, which matters: a later rule sees the flags the earlier ones set.
BUILDER_RULES: tuple[BuilderRule, ...] = (
    # --- what the GPU can run at all (support matrix: Ampere SM80/86 INT8/INT4; Ada SM89 and Hopper SM90 add FP8)
    BuilderRule(SUPPORT_MATRIX, "Ampere (SM80, SM86), Ada (SM89), Hopper (SM90) and Blackwell only",
                refuses="gpu", cc_below=(8, 0)),
    BuilderRule(SUPPORT_MATRIX, "FP8 on Ada (SM89) and newer; Ampere has FP16, BF16, INT8, INT4",
                refuses="weights", cc_below=(8, 9), weights_in=FP8),
    BuilderRule(SUPPORT_MATRIX, "FP8 on Ada (SM89) and newer; Ampere has FP16, BF16, INT8, INT4",
                refuses="kv_cache", cc_below=(8, 9), kv_in=FP8),
    # --- build() raises these after quantisation has already run (is_int8/int4_weight_only, has_int8_kv_cache,
    # has_act_and_weight_quant)
    BuilderRule(BUILD, _NOT_SM100, refuses="weights", cc_from=SM100_RANGE[0], cc_below=SM100_RANGE[1],
                weights_in=WEIGHT_ONLY),
    BuilderRule(BUILD, _NOT_SM100, refuses="kv_cache", cc_from=SM100_RANGE[0], cc_below=SM100_RANGE[1],
                kv_in=INT8),
    BuilderRule(BUILD, "SmoothQuant is not supported on SM>=100.", refuses="weights", cc_from=SM100_RANGE[0],
                cc_below=SM100_RANGE[1], weights_in=SMOOTHQUANT),
    BuilderRule(BUILD, "Per-channel or per-token scaling is not supported on SM>=100.", refuses="weights",
                cc_from=SM100_RANGE[0], cc_below=SM100_RANGE[1], weights_in=PER_CHANNEL_OR_TOKEN),
    # --- build(), "Logics to control paged_context_fmha and fp8_context_fmha" (context FMHA on)
    BuilderRule(BUILD, "FP8 Context FMHA is disabled because it must be used together with the fp8 quantization "
                "workflow.", sets=("use_fp8_context_fmha", False), weights_not_in=FP8_WORKFLOW),
    BuilderRule(BUILD, _FP8_CTX_OFF, sets=("use_paged_context_fmha", False), weights_not_in=FP8_WORKFLOW,
                kv_in=FP8),
    BuilderRule(BUILD, "FP8 context FMHA is disabled because it is only supported on Ada and Hopper Arch.",
                sets=("use_fp8_context_fmha", False), cc_below=(8, 9), weights_in=FP8_WORKFLOW),
    BuilderRule(BUILD, _FP8_CTX_OFF, sets=("use_paged_context_fmha", False), cc_below=(8, 9),
                weights_in=FP8_WORKFLOW, kv_in=FP8),
    BuilderRule(BUILD, "FP8 Paged Context FMHA is disabled because it must be used together with fp8 KV Cache.",
                sets=("use_fp8_context_fmha", False), cc_from=(8, 9), weights_in=FP8_WORKFLOW, kv_not_in=FP8,
                while_flag=("use_paged_context_fmha", True)),
    BuilderRule(BUILD, "FP8 Context FMHA is enabled to support FP8 Paged Context FMHA.",
                sets=("use_fp8_context_fmha", True), cc_from=(8, 9), weights_in=FP8_WORKFLOW, kv_in=FP8,
                while_flag=("use_paged_context_fmha", True)),
    BuilderRule(BUILD, "Paged Context FMHA is disabled because it doesn't work with int8 kv cache currently.",
                sets=("use_paged_context_fmha", False), kv_in=INT8, while_flag=("use_paged_context_fmha", True)),
)

#: What the plan asks for before the rules: paged context FMHA (KV-cache reuse and chunked context need it); FP8
#: context FMHA left off, because build() turns it on exactly where FP8 paged context FMHA needs it.
REQUESTED: Mapping[Flag, bool] = {"use_paged_context_fmha": True, "use_fp8_context_fmha": False}

#: tensorrt_llm parameters the C++ runtime switches off, with a warning, for an engine without paged context
#: FMHA: cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp: fixExecutorConfig (block reuse) and
#: cpp/tensorrt_llm/executor/executorImpl.cpp: fixExecutorConfig (chunked context). Without chunked context a
#: prompt must also fit max_num_tokens (cpp/tensorrt_llm/batch_manager/trtGptModel.h: TrtGptModel, maxInputLen).
NEEDS_PAGED_CONTEXT_FMHA = ("enable_kv_cache_reuse", "enable_chunked_context")


def refusals(quant_algo: Algo, kv_algo: Algo, cc: CC) -> list[BuilderRule]:
    """The rules that refuse this checkpoint on this compute capability (empty: the builder takes it)."""
    return [r for r in BUILDER_RULES if r.refuses and r.applies(quant_algo, kv_algo, cc, {})]


def plugin_flags(quant_algo: Algo, kv_algo: Algo, cc: CC,
                 requested: Mapping[Flag, bool] = REQUESTED) -> tuple[dict[Flag, bool], list[BuilderRule]]:
    """The flags build() ends up with for ``requested``, and the rules that changed them, in order."""
    flags = dict(requested)
    changed = []
    for rule in BUILDER_RULES:
        if rule.sets and rule.applies(quant_algo, kv_algo, cc, flags) and flags[rule.sets[0]] != rule.sets[1]:
            flags[rule.sets[0]] = rule.sets[1]
            changed.append(rule)
    return flags, changed


def flag_notes(flags: Mapping[Flag, bool], changed: list[BuilderRule]) -> list[str]:
    """One line per rule that changed a requested flag, and what the runtime does without paged context FMHA."""
    notes = [f"--{r.sets[0]} {'enable' if r.sets[1] else 'disable'}: the builder says \"{r.says}\" ({r.source})"
             for r in changed if r.sets]
    if not flags["use_paged_context_fmha"]:
        notes.append("no paged context FMHA: the runtime would switch off KV-cache reuse and chunked context, so "
                     f"the tensorrt_llm config sets {' and '.join(NEEDS_PAGED_CONTEXT_FMHA)} false; a prompt must "
                     "fit max_num_tokens")
    return notes
