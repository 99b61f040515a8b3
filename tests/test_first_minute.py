"""`make serve` as a newcomer runs it — the real Makefile target — from a plain shell, an activated venv and
with another Python first on PATH: ready, the first request streamed equals its non-streamed twin over gRPC
and HTTP and through the OpenAI front door with the `openai` SDK, and SIGTERM stops both with exit code 0
(scripts/first_minute.py; .ci/run runs it on the real model).

The test's tiny model stands in for the default one through make's own variables, so nothing is trained here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.stack import stack_profile
from tests.triton_helpers import SHELLS, shell_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import first_minute  # noqa: E402


@pytest.fixture(scope="module")
def make_args(engine_dir, tiny_checkpoint, tmp_path_factory) -> list[str]:
    work = tmp_path_factory.mktemp("first-minute")
    profile = stack_profile(engine_dir, tiny_checkpoint)
    (work / "profile.yaml").write_text(yaml.safe_dump(json.loads(profile.model_dump_json())))
    return [f"MODEL_DIR={tiny_checkpoint}", f"ENGINE_DIR={engine_dir}", f"PROFILE={work / 'profile.yaml'}",
            f"REPOSITORY={work / 'model_repository'}"]


def _shell(kind: str, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    return {**env, **shell_env(kind, tmp_path)}


@pytest.mark.parametrize("kind", SHELLS)
def test_make_serve_then_the_first_request(make_args, tmp_path, kind):
    outcome = first_minute.run(make_args, tmp_path / "make-serve.log", env=_shell(kind, tmp_path), ready_timeout=300)
    log = (tmp_path / "make-serve.log").read_text("utf-8", "replace")
    assert set(outcome.pairs) == {"grpc", "http", "openai"}
    assert outcome.openai_model
    for transport, (streamed, whole) in outcome.pairs.items():
        assert whole and streamed == whole, (transport, streamed, whole)
    assert outcome.exit_code == 0, log[-3000:]
    assert "the launcher's interpreter" in log and "drain finished" in log
    assert "openai front door ready on" in log
    # Stop order: the front door finishes its streams before Triton's drain starts.
    assert log.index("OpenAI http://localhost:") < log.index("draining: new requests are refused")


def test_make_serve_variant_builds_and_serves_that_engine():
    """`make serve VARIANT=int8_wo` (dry run): that variant's engine is built into its own folder and the repository
    is rendered over it, for either layout; the default stays the profile's engine."""
    root = Path(__file__).resolve().parent.parent

    def dry(*args: str) -> str:
        # -B: every target as if out of date, so the engine's build line shows whether or not it is built here
        return subprocess.run(["make", "-n", "-B", "-C", str(root), "serve", *args], capture_output=True, text=True,
                              check=True).stdout

    out = dry("VARIANT=int8_wo")
    assert "--output build/engines/smollm2-int8_wo --variant int8_wo" in out
    assert "--engine-dir build/engines/smollm2-int8_wo" in out
    assert "the CPU engine's int8_wo variant" in out
    assert "standin" in dry("VARIANT=int8_wo", "LAYOUT=trtllm-standin")
    assert "--engine-dir build/engines/smollm2-int8_wo" in dry("VARIANT=int8_wo", "LAYOUT=trtllm-standin")
    profile = yaml.safe_load((root / "builders" / "profiles" / "cpu.yaml").read_text())
    assert f"--engine-dir {profile['engine_dir']}" in dry()
