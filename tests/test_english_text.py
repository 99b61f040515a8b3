"""The local English text (builders/english_text.py): real prose, deterministic, calibration and evaluation
parts disjoint, and large enough for calibration and the held-out evaluation."""

from __future__ import annotations

import hashlib

from builders import english_text
from builders.english_text import (calibration_texts, evaluation_texts, is_heldout, prose_paragraph, summary,
                                   units)


def test_parts_are_disjoint_and_cover_every_unit():
    all_units = units()
    names = [u.name for u in all_units]
    assert names == sorted(names) and len(set(names)) == len(names)
    held = {u.name for u in all_units if u.heldout}
    assert held and len(held) < len(names) / 4  # about 1 in 8 held out
    calib_paragraphs = {p for u in all_units if not u.heldout for p in u.paragraphs}
    eval_paragraphs = {p for u in all_units if u.heldout for p in u.paragraphs}
    assert calib_paragraphs and eval_paragraphs and not calib_paragraphs & eval_paragraphs
    assert len(calibration_texts()) + len(evaluation_texts()) == len(all_units)
    assert not set(calibration_texts()) & set(evaluation_texts())
    # both kinds of source are present: module docstrings and Language Reference sections
    assert any(n.startswith("pydoc_data.topics/") for n in names) and "argparse" in names


def test_split_depends_only_on_the_unit_name():
    assert is_heldout("argparse") == (int(hashlib.sha256(b"argparse").hexdigest()[:8], 16) % 8 == 0)
    assert [u.heldout for u in units()] == [is_heldout(u.name) for u in units()]


def test_deterministic():
    first = summary()
    english_text._units.cache_clear()
    assert summary() == first
    assert evaluation_texts() == evaluation_texts()


def test_size_is_non_trivial():
    info = summary()
    # 64 windows × 256 tokens (~4.5 characters per BPE token of English) must fit in the held-out part, and
    # 512 TensorRT-LLM calibration samples of 2048 characters nearly fit in the calibration part.
    assert info["evaluation"]["chars"] > 100_000 and info["evaluation"]["units"] >= 40
    assert info["calibration"]["chars"] > 700_000 and info["calibration"]["units"] >= 300


def test_text_is_english_prose_not_code():
    paragraphs = [p for t in evaluation_texts() for p in t.split("\n\n")]
    assert all("\n" not in p and len(p.split()) >= 8 for p in paragraphs)
    assert not any(p.startswith((">>>", "def ", "class ", "import ")) for p in paragraphs)
    words = " ".join(paragraphs).lower().split()
    for common in ("the", "of", "a", "is", "to", "and"):  # the commonest English words are frequent
        assert words.count(common) > len(words) / 500, common


def test_prose_filter():
    assert prose_paragraph("Return the number of items in the container,\nor zero when it is empty.") == \
        "Return the number of items in the container, or zero when it is empty."
    assert prose_paragraph(">>> import os\n>>> os.getcwd()") is None
    assert prose_paragraph("Example:\n    x = f(1, 2)  # a call with two arguments here.") is None
    assert prose_paragraph("Too short to be a paragraph.") is None
    assert prose_paragraph("Copyright (C) 2001 the Python Software Foundation, all rights reserved here.") is None


def test_evaluation_report_scores_held_out_text_and_answers_the_questions(tiny_checkpoint, tmp_path):
    import json

    from builders.evaluate import QUESTIONS, heldout_windows, run_evaluation, write_report

    ev = run_evaluation(tiny_checkpoint, tmp_path / "engines", variants=("fp32", "fp8"), seq_len=64, max_windows=2,
                        max_new_tokens=4, profile=("fp8",), profile_windows=1)
    assert [r.variant for r in ev.results] == ["fp32", "fp8"] and ev.windows == 2
    assert ev.questions == list(QUESTIONS) and len(QUESTIONS) == 20
    assert all(len(r.answer_ids) == 20 and all(len(a) <= 4 for a in r.answer_ids) for r in ev.results)
    assert ev.results[1].target_pct == 2.0 and [p.variant for p in ev.sensitivity] == ["fp8"]
    write_report(ev.results, tmp_path / "evaluation.md", "python -m builders eval", ev.windows, ev.seq_len, ev, 1.0)
    md = (tmp_path / "evaluation.md").read_text()
    assert "python -m builders eval" in md and QUESTIONS[0] in md and "≤ +2%" in md and "english_text.py" in md
    data = json.loads((tmp_path / "evaluation.json").read_text())
    assert data["text"]["evaluation"]["sha256"] == summary()["evaluation"]["sha256"]
    assert len(data["results"][1]["answers"]) == 20 and data["sensitivity"][0]["variant"] == "fp8"
    # the scored windows are the held-out text, tokenised
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    assert heldout_windows(tokenizer, 64, 2)[0] == english_text.token_stream(tokenizer, evaluation_texts())[:64]
