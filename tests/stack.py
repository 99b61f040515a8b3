"""The test suite's serving stack in one place: engine limits and the profile its repositories are rendered
from (tests/conftest.py's session server, the reliability suite and its scripts)."""

from __future__ import annotations

from pathlib import Path

from builders.trtllm.standin import LAYOUTS, render_layout  # noqa: F401 - the layouts the end-to-end tests serve

# The reliability suite's prompts (tests/reliability: relkit.PROMPTS, the scripts).
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Parser:\n    def __init__(self", "x = [1, 2, 3]",
           "for i in range(10):", "# 你好 — café 👋", "return {k: v for k, v in items}", "while True:\n    pass"]
# Small limits so bad-input cases (over-long prompts, too many tokens) are cheap to provoke.
TEST_LIMITS = dict(max_batch_size=8, max_input_len=192, max_seq_len=256, max_num_tokens=64)


def stack_profile(engine: Path, tokenizer: Path, *, llm_queue: int = 32, max_batch_size: int = 8,
                  text_instances: int = 1):
    from builders.profile import LLMStage, ServingProfile, Stage

    return ServingProfile(name="test", engine_dir=engine, tokenizer_dir=tokenizer, max_batch_size=max_batch_size,
                          preprocessing=Stage(instances=text_instances),  # no dynamic batcher, as builders/profiles/cpu.yaml
                          llm=LLMStage(max_queue_size=llm_queue, cpu_threads=1))

