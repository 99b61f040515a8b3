"""Build the project's default small Llama-architecture checkpoint, offline and deterministically.

Everything comes from material present on every machine: the corpus is the top-level ``.py`` files of the
running Python's standard library, the tokenizer is a byte-level BPE trained on it with ``tokenizers``, and
the model is a ``LlamaForCausalLM`` trained from scratch for a fixed step budget (not wall time), so the
same seed + steps + spec (+ Python stdlib + thread count) give identical weights.

Public API::

    corpus_files(holdout_every=20) -> CorpusSplit
    train_tokenizer(files, vocab_size, out_dir=None) -> PreTrainedTokenizerFast
    build_model(spec, tokenizer, train_files, val_files, *, steps, seed, ...) -> (LlamaForCausalLM, TrainStats)
    evaluate_perplexity(model, tokenizer, files, ...) -> float
    build_default_model(out_dir, seed=0, steps=None, spec=None, force=False) -> Path
    build_random_model(out_dir, spec=ModelSpec.tiny(), seed=0) -> Path
    read_build_info(out_dir) -> dict | None

The checkpoint directory holds config.json, model.safetensors (float32), generation_config.json, the
tokenizer files (tokenizer.json, tokenizer_config.json) and build_info.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "DEFAULT_STEPS",
    "DEFAULT_SEQ_LEN",
    "DEFAULT_BATCH_SIZE",
    "CorpusSplit",
    "ModelSpec",
    "TrainStats",
    "corpus_files",
    "train_tokenizer",
    "build_model",
    "evaluate_perplexity",
    "save_checkpoint",
    "build_default_model",
    "build_random_model",
    "read_build_info",
    "is_complete_checkpoint",
]

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2

#: Step budget of the default build: ~3 minutes of training on 2 CPU cores (see build_info.json).
DEFAULT_STEPS = 270
DEFAULT_SEQ_LEN = 256
DEFAULT_BATCH_SIZE = 16
BUILD_FORMAT = 1  # bump when the build recipe changes so cached checkpoints are rebuilt

REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "build_info.json",
)

_threads_configured = False


# --------------------------------------------------------------------------------------------- corpus


@dataclass(frozen=True)
class CorpusSplit:
    """Deterministic train / held-out split of the corpus files (both sorted by name)."""

    train: tuple[Path, ...]
    val: tuple[Path, ...]
    root: Path

    @property
    def all(self) -> tuple[Path, ...]:
        return tuple(sorted(self.train + self.val, key=lambda p: p.name))


def corpus_files(holdout_every: int = 20, root: str | os.PathLike[str] | None = None) -> CorpusSplit:
    """Top-level ``.py`` files of the standard library, sorted by name; every ``holdout_every``-th file
    (indices ``holdout_every-1, 2*holdout_every-1, ...``) is held out for validation."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in base.glob("*.py") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no .py files under {base}")
    train = tuple(f for i, f in enumerate(files) if (i + 1) % holdout_every != 0)
    val = tuple(f for i, f in enumerate(files) if (i + 1) % holdout_every == 0)
    return CorpusSplit(train=train, val=val, root=base)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ tokenizer


def train_tokenizer(
    files: Sequence[str | os.PathLike[str]],
    vocab_size: int,
    out_dir: str | os.PathLike[str] | None = None,
    max_chars: int | None = None,
) -> Any:
    """Train a byte-level BPE (all 256 bytes in the alphabet, so any UTF-8 round-trips exactly) with
    special tokens ``<s>`` (0), ``</s>`` (1), ``<pad>`` (2); ``<s>`` is prepended on encode, like Llama.

    Returns a ``transformers.PreTrainedTokenizerFast``; when ``out_dir`` is given it is saved there
    (tokenizer.json + tokenizer_config.json). ``max_chars`` limits the training text (for quick builds).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    def texts() -> Iterator[str]:
        budget = max_chars
        for f in files:
            t = _read_text(Path(f))
            if budget is not None:
                if budget <= 0:
                    return
                t = t[:budget]
                budget -= len(t)
            yield t

    tok = Tokenizer(models.BPE())  # no unk token needed: every byte is in the alphabet
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(str(out_dir))
    return fast


def _encode_files(tokenizer: Any, files: Sequence[Path]) -> torch.Tensor:
    """Concatenate ``<s> file </s>`` for every file into one int64 token stream."""
    backend = tokenizer.backend_tokenizer
    encs = backend.encode_batch([_read_text(Path(f)) for f in files], add_special_tokens=False)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids: list[int] = []
    for e in encs:
        ids.append(bos)
        ids.extend(e.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------------------------------------ model


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of the Llama checkpoint."""

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
        """A very small spec for tests."""
        return cls(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=192,
            vocab_size=512,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def llama_config(self, bos_token_id: int = 0, eos_token_id: int = 1, pad_token_id: int = 2) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            attention_dropout=0.0,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )


@dataclass
class TrainStats:
    """What a training run measured."""

    steps: int
    seq_len: int
    batch_size: int
    train_tokens: int  # size of the packed training stream
    tokens_seen: int  # steps * batch_size * seq_len
    wall_s: float
    tokens_per_s: float
    first_loss: float
    final_loss: float  # mean of the last min(10, steps) step losses
    losses: list[float]
    val_tokens: int = 0
    val_perplexity: float | None = None


def _configure_threads(num_threads: int | None = None) -> None:
    """Set torch's intra-op thread count once per process (changing it later slows small models)."""
    global _threads_configured
    if _threads_configured:
        return
    n = num_threads or int(os.environ.get("BUILD_NUM_THREADS", 0)) or (os.cpu_count() or 1)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _threads_configured = True


def _new_model(spec: ModelSpec, tokenizer: Any, seed: int) -> Any:
    from transformers import LlamaForCausalLM

    if len(tokenizer) > spec.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens > spec.vocab_size={spec.vocab_size}")
    config = spec.llama_config(tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    return model


def build_model(
    spec: ModelSpec,
    tokenizer: Any,
    train_files: Sequence[Path],
    val_files: Sequence[Path] = (),
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = 2e-3,
    min_lr_ratio: float = 0.1,
    warmup_steps: int | None = None,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    bf16_autocast: bool = True,
    progress: bool = True,
    max_val_tokens: int | None = None,
) -> tuple[Any, TrainStats]:
    """Create a ``LlamaForCausalLM`` from ``spec`` (seeded with ``torch.manual_seed(seed)``) and train it
    with AdamW + linear warmup + cosine decay for ``steps`` steps on random windows of the packed token
    stream of ``train_files``. With ``steps=0`` the model stays at its random initialisation.
    ``bf16_autocast`` runs forward/backward in bfloat16 autocast (master weights stay float32; ~2.4x
    faster than float32 on AVX-512-bf16 CPUs).
    Validation perplexity on ``val_files`` is computed at the end when they are given."""
    from tqdm.auto import tqdm

    _configure_threads()
    model = _new_model(spec, tokenizer, seed)
    data = _encode_files(tokenizer, train_files) if steps > 0 else torch.empty(0, dtype=torch.long)
    if steps > 0 and data.numel() < seq_len + 1:
        raise ValueError(f"training stream has only {data.numel()} tokens, need > {seq_len}")

    gen = torch.Generator().manual_seed(seed + 1)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=True,
    )
    warmup = warmup_steps if warmup_steps is not None else max(1, min(30, steps // 10))

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    losses: list[float] = []
    model.train()
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc="train", disable=not progress, dynamic_ncols=True)
    offsets_arange = torch.arange(seq_len)
    for step in bar:
        starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
        batch = data[starts[:, None] + offsets_arange[None, :]]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast):
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if progress:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr_at(step):.2e}")
    bar.close()
    wall = time.perf_counter() - t0
    model.eval()
    tokens_seen = steps * batch_size * seq_len
    tail = losses[-min(10, len(losses)) :] if losses else []
    stats = TrainStats(
        steps=steps,
        seq_len=seq_len,
        batch_size=batch_size,
        train_tokens=int(data.numel()),
        tokens_seen=tokens_seen,
        wall_s=round(wall, 3),
        tokens_per_s=round(tokens_seen / wall, 1) if wall > 0 else 0.0,
        first_loss=losses[0] if losses else float("nan"),
        final_loss=sum(tail) / len(tail) if tail else float("nan"),
        losses=losses,
    )
    if val_files:
        ppl, n = _perplexity(model, tokenizer, val_files, seq_len=seq_len, batch_size=batch_size,
                             max_tokens=max_val_tokens)
        stats.val_perplexity, stats.val_tokens = ppl, n
    return model, stats


@torch.no_grad()
def _perplexity(
    model: Any,
    tokenizer: Any,
    files: Sequence[Path],
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int | None = None,
) -> tuple[float, int]:
    data = _encode_files(tokenizer, files)
    if max_tokens is not None:
        data = data[:max_tokens]
    n_windows = (data.numel() - 1) // seq_len
    if n_windows == 0:
        raise ValueError("not enough validation tokens")
    was_training = model.training
    model.eval()
    total_nll, total_n = 0.0, 0
    for i in range(0, n_windows, batch_size):
        idx = torch.arange(i, min(i + batch_size, n_windows))
        # window k predicts tokens k*seq_len+1 .. (k+1)*seq_len: every token is predicted exactly once
        x = data[idx[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]]
        logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum"
        )
        total_nll += float(nll)
        total_n += x[:, 1:].numel()
    model.train(was_training)
    return math.exp(total_nll / total_n), total_n


def evaluate_perplexity(
    model: Any,
    tokenizer: Any,
    files: Sequence[str | os.PathLike[str]] | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int | None = None,
) -> float:
    """Perplexity of ``model`` on the packed ``<s> file </s>`` stream of ``files`` (default: the
    held-out split of :func:`corpus_files`), in non-overlapping windows of ``seq_len`` tokens."""
    if files is None:
        files = corpus_files().val
    return _perplexity(model, tokenizer, [Path(f) for f in files], seq_len, batch_size, max_tokens)[0]


# ------------------------------------------------------------------------------------------ checkpoint


def save_checkpoint(model: Any, tokenizer: Any, out_dir: str | os.PathLike[str], build_info: dict[str, Any]) -> Path:
    """Write model (float32 safetensors), generation config, tokenizer and build_info.json to ``out_dir``."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.to(torch.float32).save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "build_info.json").write_text(json.dumps(build_info, indent=2, sort_keys=True) + "\n")
    return out


def read_build_info(out_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checkpoint's build_info.json, or None when missing/unreadable."""
    try:
        return json.loads((Path(out_dir) / "build_info.json").read_text())
    except (OSError, ValueError):
        return None


def is_complete_checkpoint(out_dir: str | os.PathLike[str]) -> bool:
    """True when every file of a finished build is present."""
    out = Path(out_dir)
    return all((out / f).is_file() for f in REQUIRED_FILES)


def _versions() -> dict[str, str]:
    import platform

    import tokenizers
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def _atomic_build(out_dir: Path, write: Any) -> Path:
    """Run ``write(tmp_dir)`` in a sibling temp dir, then replace ``out_dir`` with it."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "build_info.json").is_file():
        raise FileExistsError(f"{out_dir} exists and is not a checkpoint written by this builder; not replacing it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; safetensors files can come out 0600
        for f in tmp.rglob("*"):
            os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _matches(info: dict[str, Any] | None, kind: str, seed: int, steps: int, spec: ModelSpec) -> bool:
    return (
        info is not None
        and info.get("kind") == kind
        and info.get("format") == BUILD_FORMAT
        and info.get("seed") == seed
        and info.get("steps") == steps
        and info.get("spec") == spec.to_dict()
    )


def build_default_model(
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    steps: int | None = None,
    spec: ModelSpec | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Build (or reuse) the default trained checkpoint in ``out_dir`` and return its path.

    Cached: when ``out_dir`` already holds a complete checkpoint whose build_info matches ``seed``,
    ``steps`` (default :data:`DEFAULT_STEPS`) and ``spec`` (default ``ModelSpec()``), nothing is done
    unless ``force``. Training takes about 3 minutes on 2 CPU cores with the defaults."""
    out = Path(out_dir)
    spec = spec or ModelSpec()
    steps = DEFAULT_STEPS if steps is None else steps
    if not force and is_complete_checkpoint(out) and _matches(read_build_info(out), "trained", seed, steps, spec):
        return out

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        split = corpus_files()
        tokenizer = train_tokenizer(split.train, spec.vocab_size)
        t_tok = time.perf_counter() - t0
        model, stats = build_model(spec, tokenizer, split.train, split.val, steps=steps, seed=seed,
                                   progress=progress)
        info = {
            "kind": "trained",
            "format": BUILD_FORMAT,
            "seed": seed,
            "steps": steps,
            "spec": spec.to_dict(),
            "seq_len": stats.seq_len,
            "batch_size": stats.batch_size,
            "train_tokens": stats.train_tokens,
            "tokens_seen": stats.tokens_seen,
            "val_tokens": stats.val_tokens,
            "val_perplexity": round(stats.val_perplexity, 3) if stats.val_perplexity else None,
            "first_loss": round(stats.first_loss, 4),
            "final_loss": round(stats.final_loss, 4),
            "train_wall_s": stats.wall_s,
            "tokenizer_wall_s": round(t_tok, 3),
            "tokens_per_s": stats.tokens_per_s,
            "num_threads": torch.get_num_threads(),
            "corpus_root": str(split.root),
            "corpus_files": len(split.train) + len(split.val),
            "train_files": len(split.train),
            "val_files": [p.name for p in split.val],
            "tokenizer_vocab": len(tokenizer),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            **_versions(),
        }
        save_checkpoint(model, tokenizer, tmp, info)

    return _atomic_build(out, write)


def build_random_model(
    out_dir: str | os.PathLike[str],
    spec: ModelSpec = ModelSpec.tiny(),
    seed: int = 0,
    tokenizer_chars: int = 300_000,
) -> Path:
    """Write an untrained (randomly initialised, seeded) checkpoint for tests; fast (seconds).

    Its tokenizer is trained on the first ``tokenizer_chars`` characters of the training split with
    ``spec.vocab_size`` tokens. Always rebuilt; the result is byte-identical for the same arguments."""
    out = Path(out_dir)

    def write(tmp: Path) -> None:
        split = corpus_files()
        tokenizer = train_tokenizer(split.train, spec.vocab_size, max_chars=tokenizer_chars)
        _configure_threads()
        model = _new_model(spec, tokenizer, seed)
        info = {
            "kind": "random",
            "format": BUILD_FORMAT,
            "seed": seed,
            "steps": 0,
            "spec": spec.to_dict(),
            "tokenizer_chars": tokenizer_chars,
            "tokenizer_vocab": len(tokenizer),
            "corpus_files": len(split.train) + len(split.val),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            **_versions(),
        }
        save_checkpoint(model, tokenizer, tmp, info)

    return _atomic_build(out, write)
