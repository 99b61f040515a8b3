"""Local calibration text for SmoothQuant (``int8_sq``): token windows of real English prose taken evenly across
the calibration part of :mod:`builders.english_text` (standard-library docstrings and the Language Reference).

No hub dataset is involved, so calibration works offline and is reproducible; the held-out evaluation text
(``english_text.evaluation_texts()``) is never seen here.
"""

from __future__ import annotations

import torch

from .english_text import calibration_texts, token_stream


def calibration_batches(tokenizer, samples: int = 64, seq_len: int = 256, batch_size: int = 8) -> list[torch.Tensor]:
    """``samples`` windows of ``seq_len`` tokens, spread evenly over the calibration text, in batches."""
    ids = token_stream(tokenizer, calibration_texts())
    n_windows = len(ids) // seq_len
    if n_windows < samples:
        raise ValueError(f"only {n_windows} calibration windows of {seq_len} tokens in the local English text; "
                         f"lower --calib-samples")
    picks = [int(i * n_windows / samples) * seq_len for i in range(samples)]
    windows = torch.tensor([ids[start:start + seq_len] for start in picks])
    return list(windows.split(batch_size))
