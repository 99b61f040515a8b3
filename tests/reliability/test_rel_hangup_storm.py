"""Section 10 — the hang-up storm in CI: tests/reliability/scripts/hangup_storm.py itself, for seconds, on the long
engine's repository of each layout (streams of up to 800 tokens, so hang-ups land mid-stream, not after the end).
The 10-minute run on the default model is in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.reliability import relkit

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the stand-in executor

SCRIPT = relkit.PROJECT_ROOT / "tests/reliability/scripts/hangup_storm.py"


def test_clients_hanging_up_leave_no_slot_no_stall_and_a_clean_exit(long_layout_repository, tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--repository", str(long_layout_repository), "--expect", "",
                          "--duration", "15", "--concurrency", "12", "--max-tokens", "800", "--max-delay-s", "2",
                          "--stall-s", "8", "--sample-s", "1", "--workdir", str(tmp_path), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    output = run.stdout[-4000:] + run.stderr[-4000:]
    assert (tmp_path / "hangup-storm.json").exists(), output
    report = json.loads((tmp_path / "hangup-storm.json").read_text())["report"]
    assert run.returncode == 0, output
    assert report["verdict"] == "PASS" and report["failed"] == 0 and not report["wedged"], report
    assert report["at_rest_after_s"] is not None  # no slot, queue entry, KV block or front-door request left
    assert sum(report["abandoned"].values()) > 0 and report["mid_stream_hang_ups"] > 0, report
    assert report["engine_finished"]["cancelled"] > 0  # hang-ups reached the engine
    assert report["first_question"]["streamed_equal"] and report["exit_code"] == 0
