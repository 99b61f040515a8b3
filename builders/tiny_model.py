"""A tiny, randomly initialised Llama checkpoint for tests and benchmarks: seconds to build, offline, byte-identical
for the same arguments.

Its tokenizer has the real default model's shape where the serving path can tell: a byte-level BPE (trained here on
the running Python's standard-library sources, the only text every machine has) whose first three tokens are
SmolLM2's control tokens ``<|endoftext|>`` (0), ``<|im_start|>`` (1), ``<|im_end|>`` (2), no BOS added on encode,
``<|im_end|>`` as end of turn and a ChatML chat template — so chat, stop and streaming tests run on it in seconds.

    build_random_model(out_dir, spec=None (ModelSpec.tiny()), seed=0) -> Path
"""

from __future__ import annotations

import dataclasses
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint_dir import write_atomically

__all__ = ["CHAT_TEMPLATE", "ModelSpec", "build_random_model"]

END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

#: ChatML as SmolLM2-Instruct writes it (without its default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a random Llama checkpoint (the defaults: dim 256, 4 layers; ``tiny()``: what tests use)."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 768
    vocab_size: int = 4096
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-5

    @classmethod
    def tiny(cls) -> ModelSpec:
        return cls(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=192, vocab_size=512)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _stdlib_text(max_chars: int) -> Iterator[str]:
    budget = max_chars
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if budget <= 0:
            return
        text = path.read_text(encoding="utf-8", errors="replace")[:budget]
        budget -= len(text)
        yield text


def train_tokenizer(vocab_size: int, max_chars: int) -> Any:
    """Byte-level BPE (all 256 bytes in the alphabet, so any UTF-8 round-trips) with the ChatML control tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[END_OF_TEXT, TURN_START, TURN_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_stdlib_text(max_chars), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=TURN_START, eos_token=TURN_END,
                                   pad_token=TURN_END, unk_token=END_OF_TEXT, clean_up_tokenization_spaces=False,
                                   model_max_length=1024)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_random_model(out_dir: str | os.PathLike[str], spec: ModelSpec | None = None, seed: int = 0,
                       tokenizer_chars: int = 300_000) -> Path:
    """Write an untrained (seeded) float32 checkpoint with its tokenizer and generation config; always rebuilt."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    spec = spec or ModelSpec.tiny()

    def write(tmp: Path) -> None:
        tokenizer = train_tokenizer(spec.vocab_size, tokenizer_chars)
        ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
        config = LlamaConfig(**spec.to_dict(), hidden_act="silu", attention_bias=False, mlp_bias=False, **ids)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
        model.generation_config = GenerationConfig(**ids, do_sample=False)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        info = {"kind": "random", "seed": seed, "spec": spec.to_dict(), "tokenizer_chars": tokenizer_chars,
                "num_parameters": sum(p.numel() for p in model.parameters())}
        (tmp / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")

    return write_atomically(Path(out_dir), write, marker="build_info.json")
