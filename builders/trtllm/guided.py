"""Guided decoding for the ``tensorrt_llm`` backend: the xgrammar tokenizer-info file it needs beside the engine.

The backend turns guided decoding on only when ``guided_decoding_backend`` is ``xgrammar`` and
``xgrammar_tokenizer_info_path`` names a JSON file with ``encoded_vocab``, ``tokenizer_str`` and ``stop_token_ids``
(tensorrtllm_backend ``model_instance_state.cc``, ``getGuidedDecodingConfigFromParams``). This writes that file the
way TensorRT-LLM's ``generate_xgrammar_tokenizer_info.py`` does (the vocabulary ordered by id, the fast tokenizer's
own JSON, the eos id), on CPU, as part of the build; the config renders guided decoding on when the file is there.
"""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_INFO_FILE = "xgrammar_tokenizer_info.json"


def write_tokenizer_info(tokenizer_dir: str | Path, out_dir: str | Path) -> Path | None:
    """The file in ``out_dir``; None (guided decoding stays off) for a tokenizer without ``tokenizer.json``, which
    TensorRT-LLM's generator cannot describe either."""
    from transformers import AutoTokenizer  # heavy: only when building

    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return None
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    info = {"encoded_vocab": [token for token, _ in vocab], "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
            "stop_token_ids": [tokenizer.eos_token_id]}
    path = Path(out_dir) / TOKENIZER_INFO_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info), encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file
    return path


def find_tokenizer_info(engine_dir: str | Path) -> Path | None:
    """The tokenizer-info file beside the engine (in its directory or the build output above it), if any."""
    for path in (Path(engine_dir) / TOKENIZER_INFO_FILE, Path(engine_dir).parent / TOKENIZER_INFO_FILE):
        if path.is_file():
            return path
    return None
