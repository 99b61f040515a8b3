"""Render each model's ``config.pbtxt`` from the profile with Triton's own model-config protobuf.

No text templates: a config is a ``ModelConfig`` message, printed by protobuf's text format, so a missing
value is a Python error at render time, never a ``${placeholder}`` that breaks parsing in the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from .profile import DynamicBatcher, ServingProfile


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton data type without the TYPE_ prefix
    dims: tuple[int, ...] = (1,)
    optional: bool = False


def _t(name, dtype, dims=(1,), optional=False):
    return TensorSpec(name, dtype, tuple(dims), optional)


# The ensemble's text contract: tensorrtllm_backend's names and types, plus our three extra outputs, and
# ``messages`` (a chat: one JSON array of {role, content}) as the alternative to ``text_input``; preprocessing
# requires exactly one of the two (serving/chat.py). One source for the CPU and the GPU layout.
# max_tokens is optional here only to Triton, and required by preprocessing ("max_tokens is required"): Triton 2.51
# checks an ensemble request's *number* of inputs against the number required, not their names: with max_tokens the
# only required input, {"text_input": ...} alone passed the check and the ensemble ended without any response
# (HTTP 200 with an error about the response count; tests/test_chat.py checks the message both protocols get).
# Issue 17's controls (serving/request_params.py CONTROL_INPUTS): TensorRT-LLM's names and types, except min_p and
# top_logprobs (ours; the GPU layout refuses them); the same names from the ensemble through preprocessing to the llm.
CONTROL_TENSORS = (
    _t("repetition_penalty", "FP32", optional=True), _t("presence_penalty", "FP32", optional=True),
    _t("frequency_penalty", "FP32", optional=True), _t("min_p", "FP32", optional=True),
    _t("return_log_probs", "BOOL", optional=True), _t("top_logprobs", "INT32", optional=True),
    _t("num_return_sequences", "INT32", optional=True),
    _t("guided_decoding_guide_type", "STRING", optional=True), _t("guided_decoding_guide", "STRING", optional=True),
)
ENSEMBLE_INPUTS = (
    _t("text_input", "STRING", optional=True), _t("messages", "STRING", optional=True),
    # With messages: OpenAI's chat tools (a JSON array) and the chat template's own variables (a JSON object).
    _t("tools", "STRING", optional=True), _t("chat_template_kwargs", "STRING", optional=True),
    _t("max_tokens", "INT32", optional=True),
    _t("bad_words", "STRING", (-1,), True), _t("stop_words", "STRING", (-1,), True),
    _t("end_id", "INT32", optional=True), _t("pad_id", "INT32", optional=True),
    _t("top_k", "INT32", optional=True), _t("top_p", "FP32", optional=True),
    _t("temperature", "FP32", optional=True), _t("min_tokens", "INT32", optional=True),
    _t("seed", "UINT64", optional=True), _t("stream", "BOOL", optional=True),
    _t("exclude_input_in_output", "BOOL", optional=True),
    # OpenAI's logit_bias by token id; preprocessing makes TensorRT-LLM's embedding_bias of it (one value per
    # vocabulary entry). tensorrtllm_backend's ensemble takes words (embedding_bias_words) where OpenAI has ids.
    _t("embedding_bias_token_ids", "INT32", (-1,), True), _t("embedding_bias_weights", "FP32", (-1,), True),
) + CONTROL_TENSORS
ENSEMBLE_OUTPUTS = (
    _t("text_output", "STRING", (-1,)), _t("finish_reason", "STRING"),
    _t("num_input_tokens", "INT32"), _t("num_output_tokens", "INT32"),
    # Prompt tokens whose KV came from the prefix cache (TensorRT-LLM's kv_cache_reused_blocks × tokens_per_block).
    _t("num_cached_tokens", "INT32"),
    # TensorRT-LLM's log-prob outputs ([beam, tokens] and [beam]; beam width 1) and sequence_index; the token bytes
    # and the top alternatives are ours. Each covers the generated tokens whose text this response carries
    # (serving/sequence_output.py); left out of the responses of a request that asked for no log-probs.
    _t("output_log_probs", "FP32", (-1, -1)), _t("cum_log_probs", "FP32", (-1,)),
    _t("output_token_bytes", "STRING", (-1,)), _t("top_logprob_bytes", "STRING", (-1, -1)),
    _t("top_logprob_values", "FP32", (-1, -1)), _t("sequence_index", "INT32"),
)
# The LLM model's contract (tensorrtllm backend names) as fed by preprocessing.
LLM_INPUTS = (
    _t("input_ids", "INT32", (-1,)), _t("input_lengths", "INT32"), _t("request_output_len", "INT32"),
    _t("end_id", "INT32", optional=True), _t("pad_id", "INT32", optional=True),
    _t("stop_words_list", "INT32", (2, -1), True), _t("bad_words_list", "INT32", (2, -1), True),
    _t("runtime_top_k", "INT32", optional=True), _t("runtime_top_p", "FP32", optional=True),
    _t("temperature", "FP32", optional=True), _t("random_seed", "UINT64", optional=True),
    _t("min_tokens", "INT32", optional=True), _t("streaming", "BOOL", optional=True),
    _t("exclude_input_in_output", "BOOL", optional=True), _t("embedding_bias", "FP32", (-1,), True),
) + CONTROL_TENSORS
# Only the LLM model takes ``stop`` (TensorRT-LLM's: end the running request with this request id).
LLM_CONTROL_INPUTS = (_t("stop", "BOOL", optional=True),)
# TensorRT-LLM's two outputs, then the ensemble's four: the llm answers in text itself (serving.triton_io.
# llm_response says why no postprocessing model follows it), so the ensemble ends with the llm.
LLM_OUTPUTS = (
    _t("output_ids", "INT32", (-1, -1)), _t("sequence_length", "INT32", (-1,)),
) + ENSEMBLE_OUTPUTS
# preprocessing turns every ensemble input into the LLM input of the same meaning (all always present).
PREPROCESSING_OUTPUTS = tuple(TensorSpec(t.name, t.dtype, t.dims) for t in LLM_INPUTS)
# Called directly (not through the ensemble), preprocessing is the model's tokenizer: a prompt or a chat in, its
# input_ids out (the front door's /tokenize); token_ids in, their text out (/detokenize).
DETOKENIZE_INPUTS = (_t("token_ids", "INT32", (-1,), True),)
DETOKENIZE_OUTPUTS = (_t("detokenized_text", "STRING"),)


LIMIT_KEYS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")


def engine_limits(config: dict) -> dict:
    """What the configs are rendered with, from an engine ``config.json`` (the CPU engine's or TensorRT-LLM's, one
    schema): the build's four limits and the vocabulary's size."""
    build = config["build_config"]
    missing = [k for k in LIMIT_KEYS if k not in build]
    if missing:
        raise ValueError(f"engine config.json has no build_config.{', '.join(missing)}: not an engine config")
    return {**{k: build[k] for k in LIMIT_KEYS}, "vocab_size": config["pretrained_config"]["vocab_size"]}


def _io(spec: TensorSpec, kind):
    msg = kind(name=spec.name, data_type=getattr(mc, f"TYPE_{spec.dtype}"), dims=list(spec.dims))
    if spec.optional:
        msg.optional = True
    return msg


def _batcher(b: DynamicBatcher) -> mc.ModelDynamicBatching:
    db = mc.ModelDynamicBatching(max_queue_delay_microseconds=b.max_queue_delay_us,
                                 preferred_batch_size=b.preferred_batch_sizes)
    if b.max_queue_size:
        db.default_queue_policy.max_queue_size = b.max_queue_size
    return db


def _python_model(name: str, max_batch_size: int, inputs, outputs, instances: int,
                  parameters: dict[str, object]) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size,
                         input=[_io(t, mc.ModelInput) for t in inputs],
                         output=[_io(t, mc.ModelOutput) for t in outputs],
                         instance_group=[mc.ModelInstanceGroup(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)])
    for key, value in parameters.items():
        cfg.parameters[key].string_value = str(value)
    return cfg


def preprocessing_config(p: ServingProfile, limits: dict) -> mc.ModelConfig:
    cfg = _python_model("preprocessing", p.max_batch_size, ENSEMBLE_INPUTS + DETOKENIZE_INPUTS,
                        PREPROCESSING_OUTPUTS + DETOKENIZE_OUTPUTS,
                        p.preprocessing.instances,
                        {"tokenizer_dir": p.tokenizer_dir, "max_input_len": limits["max_input_len"],
                         "max_seq_len": limits["max_seq_len"], "vocab_size": limits["vocab_size"],
                         # to refuse at the entry what the llm would (serving/queue_full.py)
                         "llm_instances": p.llm.instances, "llm_max_queue_size": p.llm.max_queue_size})
    if p.preprocessing.batcher is not None:
        cfg.dynamic_batching.CopyFrom(_batcher(p.preprocessing.batcher))
    return cfg


def llm_config(p: ServingProfile, limits: dict) -> mc.ModelConfig:
    """The ``llm`` model's part that both layouts share; each layout adds its engine's settings (cpu_layout.py,
    trtllm/layout.py)."""
    cfg = _python_model(p.llm_model_name, p.max_batch_size, LLM_INPUTS + LLM_CONTROL_INPUTS, LLM_OUTPUTS,
                        p.llm.instances,
                        {"engine_dir": p.engine_dir, "tokenizer_dir": p.tokenizer_dir,
                         "max_queue_size": p.llm.max_queue_size, "cpu_threads": p.llm.cpu_threads,
                         "drain_timeout_s": p.llm.drain_timeout_s, "stream_interval_ms": p.llm.stream_interval_ms})
    cfg.model_transaction_policy.decoupled = True
    # No dynamic batcher: execute() only enqueues, so Triton's queue stays short without one (the engine's bounded
    # queue rejects), and Triton 2.51's batcher can sleep out its 500 ms timeout with the instance free (B12 in
    # docs/reliability.md), which held a client's `stop` that long.
    return cfg


def ensemble_config(p: ServingProfile) -> mc.ModelConfig:
    llm_inputs = {t.name for t in LLM_INPUTS}
    steps = [
        mc.ModelEnsembling.Step(
            model_name="preprocessing", model_version=-1,
            input_map={t.name: t.name for t in ENSEMBLE_INPUTS},
            output_map={t.name: f"_pre_{t.name}" for t in PREPROCESSING_OUTPUTS}),
        mc.ModelEnsembling.Step(
            model_name=p.llm_model_name, model_version=-1,
            input_map={name: f"_pre_{name}" for name in sorted(llm_inputs)},
            output_map={t.name: t.name for t in ENSEMBLE_OUTPUTS}),
    ]
    cfg = mc.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=p.max_batch_size,
                         input=[_io(t, mc.ModelInput) for t in ENSEMBLE_INPUTS],
                         output=[_io(t, mc.ModelOutput) for t in ENSEMBLE_OUTPUTS],
                         ensemble_scheduling=mc.ModelEnsembling(step=steps))
    # Read by the OpenAI front door (serving/openai) over gRPC's ModelConfig: the id it serves the model under.
    cfg.parameters["served_model_name"].string_value = p.model_id
    return cfg


def set_parameter(cfg: mc.ModelConfig, key: str, value) -> None:
    """A model parameter as the Python models read it: a string, booleans lower-case."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    cfg.parameters[key].string_value = str(value)


def layout_models(p: ServingProfile, limits: dict, llm: mc.ModelConfig) -> list[tuple[str, str | None, mc.ModelConfig]]:
    """(model name, source folder in model_repository/ or None, ModelConfig) of a layout: the same preprocessing
    and ensemble around the layout's ``llm``."""
    return [("preprocessing", "preprocessing", preprocessing_config(p, limits)), (p.llm_model_name, "llm", llm),
            ("ensemble", None, ensemble_config(p))]


def to_pbtxt(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


def parse_pbtxt(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())
