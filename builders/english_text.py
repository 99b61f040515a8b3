"""Real English text that every machine (and the CPU image) has without a network: the Python standard
library's own documentation prose, split into a calibration part and a held-out evaluation part.

Where it comes from, exactly:

* **Docstrings** of every ``.py`` module under the running interpreter's standard library
  (``sysconfig.get_paths()["stdlib"]``, recursively, without ``site-packages`` and the test and demo packages
  ``test``, ``tests``, ``idle_test``, ``lib2to3``, ``turtledemo``, ``__phello__``): the module, class and function
  docstrings, read with ``ast`` (nothing is imported or executed) and cleaned by ``ast.get_docstring``.
* **The Python Language Reference** as the interpreter ships it for ``help()``: ``pydoc_data/topics.py``, a dict
  of ~80 reference sections (read with ``ast.literal_eval``, not imported).

Each docstring or section is cut into paragraphs at blank lines, and only prose-like paragraphs are kept: no
indented line (code, grammar, tables, lists), no doctest line, at least 8 words, ending like a sentence
(``.`` ``?`` ``!``), at least 88% letters and spaces, at least 70% plain words, no copyright notice. A paragraph's
line breaks become spaces (the text was wrapped at ~72 columns, not written with line breaks). A paragraph seen
before (in sorted unit order) is dropped, so no paragraph occurs twice anywhere.

A *unit* is one module (``"email.message"``) or one reference section (``"pydoc_data.topics/assignment"``). A
unit is held out for evaluation when the first 8 hex digits of the SHA-256 of its name are divisible by
``HOLDOUT_EVERY`` (about 1 in 8): a fixed split that does not shift when a Python release adds or removes a
module. Calibration text and evaluation text therefore share no unit and no paragraph.

Deterministic for a given standard library: Python 3.11.7 (pyenv on our machines, ``python:3.11.7`` in the CPU
image) gives the same text everywhere; :func:`summary` reports sizes and a SHA-256 of each part for provenance.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HOLDOUT_EVERY = 8
SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "lib2to3", "turtledemo", "__phello__",
                       "__pycache__"})
TOPICS_FILE = "pydoc_data/topics.py"
SEPARATOR = "\n\n"

_PLAIN_WORD = re.compile(r"[A-Za-z][a-z'-]*[,.;:]?")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class Unit:
    name: str  # "email.message" or "pydoc_data.topics/assignment"
    paragraphs: tuple[str, ...]

    @property
    def text(self) -> str:
        return SEPARATOR.join(self.paragraphs)

    @property
    def heldout(self) -> bool:
        return is_heldout(self.name)


def is_heldout(name: str) -> bool:
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:8], 16) % HOLDOUT_EVERY == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def prose_paragraph(paragraph: str) -> str | None:
    """The paragraph as one line of prose, or None when it does not look like English prose."""
    lines = paragraph.strip("\n").split("\n")
    if any(not line.strip() or line[:1].isspace() or line.lstrip().startswith((">>>", "...")) for line in lines):
        return None
    text = " ".join(line.strip() for line in lines)
    words = text.split()
    if len(words) < 8 or not text.endswith((".", "?", "!", ".)", '."')):
        return None
    if sum(c.isalpha() or c.isspace() for c in text) < 0.88 * len(text):
        return None
    if sum(bool(_PLAIN_WORD.fullmatch(w)) for w in words) < 0.7 * len(words):
        return None
    if "copyright" in text.lower():
        return None
    return text


def _paragraphs(doc: str) -> list[str]:
    return [p for p in (prose_paragraph(part) for part in _BLANK_LINE.split(doc)) if p]


def _module_docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in ast.walk(tree):  # breadth-first from the module: deterministic order
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                out.extend(_paragraphs(doc))
    return out


def _reference_topics(root: Path) -> dict[str, str]:
    path = root / TOPICS_FILE
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


@lru_cache(maxsize=4)
def _units(root: str) -> tuple[Unit, ...]:
    base = Path(root)
    raw: list[tuple[str, list[str]]] = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if SKIP_DIRS.intersection(rel.parts[:-1]) or rel.as_posix() == TOPICS_FILE:
            continue
        parts = rel.with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        raw.append((name, _module_docstrings(path)))
    for key, text in sorted(_reference_topics(base).items()):
        raw.append((f"pydoc_data.topics/{key}", _paragraphs(text)))
    seen: set[str] = set()
    units = []
    for name, paragraphs in sorted(raw, key=lambda item: item[0]):
        fresh = [p for p in paragraphs if not (p in seen or seen.add(p))]
        if fresh:
            units.append(Unit(name, tuple(fresh)))
    if not units:
        raise FileNotFoundError(f"no English prose found in the standard library at {base}")
    return tuple(units)


def units(root: str | Path | None = None) -> tuple[Unit, ...]:
    """All units with their prose paragraphs, sorted by name."""
    return _units(str(Path(root) if root is not None else stdlib_root()))


def calibration_texts(root: str | Path | None = None) -> list[str]:
    """One text per calibration unit (paragraphs separated by a blank line), in name order."""
    return [u.text for u in units(root) if not u.heldout]


def evaluation_texts(root: str | Path | None = None) -> list[str]:
    """One text per held-out unit, in name order; disjoint from :func:`calibration_texts`."""
    return [u.text for u in units(root) if u.heldout]


def token_stream(tokenizer, texts: list[str]) -> list[int]:
    """The texts tokenised without special tokens and concatenated, a blank line between texts."""
    encoded = tokenizer([t + SEPARATOR for t in texts], add_special_tokens=False)["input_ids"]
    return [i for ids in encoded for i in ids]


def summary(root: str | Path | None = None) -> dict:
    """Provenance: where the text comes from, how big each part is, and a SHA-256 of each part."""
    import sys

    all_units = units(root)
    out = {"source": "docstrings of the standard library's modules + pydoc_data.topics (Language Reference), "
                     "prose paragraphs only (builders/english_text.py)",
           "stdlib": str(Path(root) if root is not None else stdlib_root()),
           "python": sys.version.split()[0], "holdout": f"sha256(unit name) % {HOLDOUT_EVERY} == 0"}
    for part, held in (("calibration", False), ("evaluation", True)):
        chosen = [u for u in all_units if u.heldout == held]
        text = SEPARATOR.join(u.text for u in chosen)
        out[part] = {"units": len(chosen), "paragraphs": sum(len(u.paragraphs) for u in chosen),
                     "chars": len(text), "words": len(text.split()),
                     "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    return out


if __name__ == "__main__":  # python -m builders.english_text: sizes, hashes and a sample
    import json

    print(json.dumps(summary(), indent=2))
    print(evaluation_texts()[0][:600])
