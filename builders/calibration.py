"""Local calibration text: packed token windows from the training split of the standard-library corpus.

No hub dataset is involved, so SmoothQuant calibration works offline and is reproducible.
"""

from __future__ import annotations

import torch

from .default_model import corpus_files


def calibration_batches(tokenizer, samples: int = 64, seq_len: int = 256, batch_size: int = 8) -> list[torch.Tensor]:
    ids: list[int] = []
    for path in corpus_files().train:
        ids.extend(tokenizer.encode(path.read_text(encoding="utf-8", errors="replace")))
        if len(ids) >= samples * seq_len:
            break
    windows = torch.tensor(ids[: samples * seq_len]).view(-1, seq_len)
    return list(windows.split(batch_size))
