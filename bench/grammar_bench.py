"""Cost of guided decoding per step: 16 rows constrained by JSON schemas against the same 16 rows unconstrained, on the
real model (SmolLM2-135M fp32 engine). Writes docs/benchmarks/grammar.md and grammar.json.

    python -m bench.grammar_bench [--engine-dir build/engines/smollm2-fp32] [--steps 48] [--threads 1]

Goal (issue 17): a step of 16 constrained rows costs at most 25% more than unconstrained.

Each step is timed in parts: the model's forward over the 16 rows, the mask (each row's matcher fills its bitmask
row, then one apply over the [16, V] logits), and sampling with the matchers' accept. Only steps where all 16 rows
are still generating count, so both sides compare the same batch. The loop (:func:`decode`) is a minimal stand-in
for the engine's step (prefill all rows in one padded forward, then one decode forward per step); the acceptance test
(tests/test_grammar.py) generates with it too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cpu_engine.grammar import CompiledGuide, Grammars, apply_bitmask, new_bitmask
from cpu_engine.kv_cache import KVCache
from cpu_engine.model import Transformer

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIR = ROOT / "build/engines/smollm2-fp32"  # the Makefile's ENGINE_DIR
REPORT = ROOT / "docs/benchmarks/grammar"
GOAL = 1.25  # constrained step / unconstrained step
TEMPERATURE = 0.7

# What the benchmark's 16 rows are asked for (also the acceptance test's first schema).
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 20},
                                           "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                                       "minItems": 1, "maxItems": 3}},
          "required": ["name", "age", "city", "hobbies"]}


@dataclass
class StepTimes:
    """Seconds per part of each decode step during which every row was still generating."""

    forward: list[float] = field(default_factory=list)
    mask: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)

    def total(self) -> list[float]:
        return [a + b + c for a, b, c in zip(self.forward, self.mask, self.sample)]


def prompt_ids(tokenizer, schema: dict) -> list[int]:
    messages = [{"role": "user", "content": f"Reply with JSON that follows this JSON schema: {json.dumps(schema)}"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def decode(model: Transformer, cache: KVCache, prompts: list[list[int]], guides: list[CompiledGuide | None],
           seeds: list[int], end_id: int, max_new_tokens: int, temperature: float = TEMPERATURE,
           times: StepTimes | None = None) -> tuple[list[list[int]], list[bool]]:
    """Generate for up to ``cache.num_slots`` rows at once: (each row's tokens without end_id, whether it ended by
    itself rather than at max_new_tokens). A row with a guide is masked by it every step and ends when it finishes."""
    rows = len(prompts)
    matchers = [g.matcher(end_id) if g is not None else None for g in guides]
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    outputs: list[list[int]] = [[] for _ in range(rows)]
    ended = [False] * rows
    width = max(map(len, prompts))
    logits = model(torch.tensor([p + [0] * (width - len(p)) for p in prompts]), torch.arange(width)[None].repeat(rows, 1),
                   torch.arange(rows), cache, last=torch.tensor([len(p) - 1 for p in prompts]))
    active = list(range(rows))
    while True:
        start = time.perf_counter()
        guided = [j for j, i in enumerate(active) if matchers[i] is not None]
        if guided:
            bitmask = new_bitmask(len(guided), logits.shape[-1])
            for b, j in enumerate(guided):
                matchers[active[j]].fill(bitmask, b)
            constrained = logits[guided]
            apply_bitmask(constrained, bitmask)
            logits[guided] = constrained
        masked = time.perf_counter()
        for j, i in enumerate(active):
            probs = torch.softmax(logits[j] / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generators[i]))
            if matchers[i] is not None:
                assert matchers[i].accept(token), "the sampled token was outside the mask"
            if token == end_id or (matchers[i] is not None and matchers[i].finished()):
                ended[i] = True
            else:
                outputs[i].append(token)
        sampled = time.perf_counter()
        still = [i for i in active if not ended[i] and len(outputs[i]) < max_new_tokens]
        if not still:
            return outputs, ended
        if times is not None and len(active) == rows == len(still):
            times.mask.append(masked - start)
            times.sample.append(sampled - masked)
        active = still
        start = time.perf_counter()
        logits = model(torch.tensor([[outputs[i][-1]] for i in active]),
                       torch.tensor([[len(prompts[i]) + len(outputs[i]) - 1] for i in active]),
                       torch.tensor(active), cache)
        if times is not None and len(active) == rows:
            times.forward.append(time.perf_counter() - start)


def _median_ms(values: list[float]) -> float:
    return round(1e3 * statistics.median(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engine-dir", type=Path, default=ENGINE_DIR)
    parser.add_argument("--steps", type=int, default=48, help="decode steps per side (%(default)s)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from cpu_engine.engine_dir import load_engine

    engine = load_engine(args.engine_dir)
    pc = engine.config["pretrained_config"]
    tokenizer_dir = engine.config["source_checkpoint"]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    grammars = Grammars(tokenizer_dir, pc["vocab_size"])
    guide = grammars.compile("json_schema", json.dumps(PERSON))
    prompt = prompt_ids(tokenizer, PERSON)
    rows = 16
    cache = KVCache(engine.model.args, rows, len(prompt) + args.steps + 1, engine.compute_dtype)
    sides = {}
    with torch.inference_mode():
        for name, guides in (("unconstrained", [None] * rows), ("constrained", [guide] * rows)):
            times = StepTimes()
            # Unconstrained rows never stop early (no end_id); constrained ones stop when their JSON is done.
            decode(engine.model, cache, [prompt] * rows, guides, list(range(rows)), -1 if guides[0] is None
                   else tokenizer.eos_token_id, args.steps, times=times)
            sides[name] = {"steps": len(times.forward), "forward_ms": _median_ms(times.forward),
                           "mask_ms": _median_ms(times.mask), "sample_ms": _median_ms(times.sample),
                           "step_ms": _median_ms(times.total())}
    ratio = round(sides["constrained"]["step_ms"] / sides["unconstrained"]["step_ms"], 3)
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rows": rows,
              "threads": args.threads, "engine": str(args.engine_dir.relative_to(ROOT)
                                                     if args.engine_dir.is_relative_to(ROOT) else args.engine_dir),
              "schema": PERSON, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_average": [round(x, 2) for x in os.getloadavg()], "sides": sides,
              "constrained_over_unconstrained": ratio, "goal": GOAL, "goal_met": ratio <= GOAL}
    REPORT.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| rows | side | steps timed | forward ms | mask ms (fill + apply) | sample ms | step ms |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, side in sides.items():
        lines.append(f"| {rows} | {name} | {side['steps']} | {side['forward_ms']} | {side['mask_ms']} | "
                     f"{side['sample_ms']} | {side['step_ms']} |")
    table = "\n".join(lines)
    print(table)
    print(f"constrained / unconstrained step: {ratio} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'missed'})")
    REPORT.with_suffix(".md").write_text(_report(result, table))


def _report(result: dict, table: str) -> str:
    verdict = "met" if result["goal_met"] else "missed"
    return f"""# Guided decoding: cost per step

`python -m bench.grammar_bench` ({result['date']}; {result['machine']}, {result['threads']} torch thread, load
average {', '.join(map(str, result['load_average']))} at the end; the machine is shared, so single timings move by
tens of percent: medians over the steps where all {result['rows']} rows were generating).

{result['rows']} rows of the same chat prompt on `{result['engine']}`, sampled at temperature {TEMPERATURE}: unconstrained,
then each row guided by the JSON schema in grammar.json (`cpu_engine/grammar.py`: an xgrammar matcher per row fills
its row of an int32 bitmask, one torch unpack + `masked_fill_` applies the [16, V] mask, each sampled token is
accepted by its matcher).

{table}

Constrained / unconstrained step: **{result['constrained_over_unconstrained']}** — goal ≤ {result['goal']}
(issue 17): **{verdict}**.
"""


if __name__ == "__main__":
    main()
