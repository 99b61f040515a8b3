"""Lay out a Triton model repository from a profile: model code from ``model_repository/``, configs rendered."""

from __future__ import annotations

import shutil
from pathlib import Path

from . import triton_config as tc
from .profile import PROJECT_ROOT, ServingProfile

MODEL_SOURCES = PROJECT_ROOT / "model_repository"


def model_configs(profile: ServingProfile):
    """(model name, source folder in model_repository/ or None, ModelConfig) for every model of the profile's
    layout: cpu_layout.py or trtllm/layout.py renders them."""
    if profile.target == "trtllm":
        from .trtllm.layout import model_configs_trtllm

        return model_configs_trtllm(profile)
    from .cpu_layout import model_configs_cpu

    return model_configs_cpu(profile)


def render_repository(profile: ServingProfile, out_dir: str | Path, configs=None) -> Path:
    """Write ``out_dir`` from scratch: a stale model left from another profile must not be served.

    ``configs`` (name, source folder, ModelConfig) defaults to :func:`model_configs` of the profile.
    """
    profile = profile.resolved()
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for name, source, config in configs if configs is not None else model_configs(profile):
        version_dir = out_dir / name / "1"
        version_dir.mkdir(parents=True)
        if source is not None:
            shutil.copy2(MODEL_SOURCES / source / "1" / "model.py", version_dir / "model.py")
        (out_dir / name / "config.pbtxt").write_text(tc.to_pbtxt(config))
    return out_dir
