"""Guided decoding (structured output): TensorRT-LLM's guide types compiled by xgrammar into per-step token masks.

TensorRT-LLM's ``guided_decoding_guide_type`` / ``guided_decoding_guide`` with the same grammar engine it uses:

- ``json``: any JSON object or array (TensorRT-LLM compiles xgrammar's builtin JSON grammar, whose root is exactly
  that); the guide text is not used.
- ``json_schema``: a JSON Schema (draft 2020-12), refused before any token is generated when it is invalid or uses a
  keyword that xgrammar would compile but not enforce (:data:`UNENFORCED`): a schema we accept, every finished
  output validates against.
- ``regex``: the whole output matches the regular expression.
- ``ebnf_grammar``: the whole output derives from the GBNF grammar's ``root`` rule.
- ``structural_tag``: xgrammar's structural tag (``{"type": "structural_tag", "format": {...}}``, the string TensorRT-LLM's
  ``GuideType.STRUCTURAL_TAG`` passes to xgrammar unchanged): free text with constrained parts, e.g. a tool call's JSON
  after a ``<tool_call>`` trigger (serving/tools.py). Each JSON schema inside is checked as ``json_schema`` guides are.

JSON comes out the way ``json.dumps`` writes it (``", "`` and ``": "``, no other whitespace): TensorRT-LLM lets any
whitespace through, which lets a model loop on newlines forever. Schemas compile in xgrammar's ``strict_mode`` (as in
TensorRT-LLM): an object schema that declares properties gets no others unless ``additionalProperties`` allows them.
Patterns match the whole string. Both only narrow what comes out; it still validates.

Per model: :class:`Grammars` (tokenizer and vocabulary once, compiled guides LRU-cached). Per sequence: a
:class:`Matcher` from :meth:`CompiledGuide.matcher`. Per step: :func:`new_bitmask` once, :meth:`Matcher.fill` for
each constrained row, :func:`apply_bitmask` once over the step's logits, then :meth:`Matcher.accept` with the
sampled token.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerFast

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
CACHE_SIZE = 128  # compiled guides kept per model (each 14-550 KiB)
# xgrammar's default without any_whitespace is already json.dumps's; written out so that what clients get cannot
# move with a later default.
SEPARATORS = (", ", ": ")

SCHEMA_VALIDATOR = jsonschema.Draft202012Validator
# The keywords that constrain a document in the drafts jsonschema knows (unknown keys constrain nothing anywhere).
# ENFORCED: those xgrammar 0.2.9 enforces (tests/test_grammar.py tries a violating document for each), some only in
# the forms _unenforced lets through; every other one is refused by name (the test shows xgrammar ignoring several).
_VOCABULARY = {*jsonschema.Draft202012Validator.VALIDATORS, *jsonschema.Draft201909Validator.VALIDATORS,
               *jsonschema.Draft7Validator.VALIDATORS, "then", "else", "minContains", "maxContains"}
ENFORCED = {"type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
            "propertyNames", "minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems",
            "anyOf", "allOf", "$ref", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems"}
UNENFORCED = _VOCABULARY - ENFORCED
HINTS = {"oneOf": "exactly-one-branch is not enforced; use anyOf",
         "if": "conditionals are not enforced", "then": "conditionals are not enforced",
         "else": "conditionals are not enforced",
         "additionalItems": "draft-07 tuples are not supported; use prefixItems and items",
         "contains": "xgrammar's grammar for it in strict mode takes no array at all"}
# Formats whose strings xgrammar constrains (the others compile to any string).
FORMATS = {"date", "time", "date-time", "duration", "email", "uuid", "ipv4", "ipv6", "uri", "json-pointer"}
# Where subschemas sit, by keyword: one schema, a list of them, or a name -> schema map.
_ONE = {"additionalProperties", "items", "propertyNames"}
_LIST = {"prefixItems", "anyOf", "allOf"}
_MAP = {"properties", "patternProperties", "$defs", "definitions"}
_CXX_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GuideError(ValueError):
    """A guide that cannot be compiled, or that asks for something the grammar would not enforce."""


def _strip_cxx(error: Exception) -> str:
    return _CXX_PREFIX.sub("", str(error).strip())


def _where(path: tuple) -> str:
    return "/" + "/".join(map(str, path)) if path else "the root"


def check_schema(schema: object) -> None:
    """Refuse an invalid schema (naming where) or one that uses a keyword xgrammar would not enforce."""
    try:
        SCHEMA_VALIDATOR.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise GuideError(f"json_schema: invalid schema at {_where(tuple(error.path))}: {error.message}") from None
    for path, keyword, why in _unenforced(schema, ()):
        raise GuideError(f"json_schema: keyword {keyword!r} at {_where(path)} is not supported: {why}")


def _unenforced(schema: object, path: tuple) -> Iterator[tuple[tuple, str, str]]:
    """(where, keyword, why) for each use of a keyword that a compiled grammar would let a violation through."""
    if not isinstance(schema, dict):  # true / false
        return
    for keyword, value in schema.items():
        if keyword in UNENFORCED:
            yield path, keyword, HINTS.get(keyword, "the grammar engine does not enforce it")
        elif keyword == "allOf" and len(value) > 1:
            yield path, keyword, "only a single subschema is enforced"
        elif keyword == "multipleOf" and not (schema.get("type") == "integer" and isinstance(value, int)):
            yield path, keyword, "enforced only as an integer on type 'integer'"
        elif keyword == "format" and value not in FORMATS:
            yield path, keyword, f"format {value!r} is not enforced (enforced: {', '.join(sorted(FORMATS))})"
        elif keyword == "uniqueItems" and value:
            yield path, keyword, "the grammar engine does not enforce it"
        elif keyword == "$ref" and not (value == "#" or value.startswith("#/")):
            yield path, keyword, f"only references inside the schema (#/...) are followed, not {value!r}"
        elif keyword in ("$id", "$anchor", "$dynamicAnchor") and path:
            yield path, keyword, "references resolve against the root schema only"
        elif keyword in _ONE:
            yield from _unenforced(value, (*path, keyword))
        elif keyword in _LIST:
            for i, sub in enumerate(value):
                yield from _unenforced(sub, (*path, keyword, i))
        elif keyword in _MAP:
            for name, sub in value.items():
                yield from _unenforced(sub, (*path, keyword, name))


_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


class SurrogateGuard:
    """xgrammar 0.2.9 takes the bytes of a UTF-16 surrogate (ED A0-BF xx: not UTF-8) as one character of a string or
    character class; seen, a name under ``maxLength: 8`` that decoded to 10 characters, three of them U+FFFD. The
    guard masks that byte pair inside a token at every step, and across two: after a token ending in ED, no token
    starting with A0-BF."""

    def __init__(self, decoded_vocab: list[bytes], vocab_size: int):
        self.always = new_bitmask(1, vocab_size)[0]  # allowed at every step
        self.after_lead = new_bitmask(1, vocab_size)[0]  # allowed right after a token ending in ED
        self.ends_in_lead = set()
        for token, text in enumerate(decoded_vocab):
            if _SURROGATE.search(text):
                _disallow(self.always, token)
            if text[:1] and 0xA0 <= text[0] <= 0xBF:
                _disallow(self.after_lead, token)
            if text.endswith(b"\xed"):
                self.ends_in_lead.add(token)


class Matcher:
    """One sequence's place in its guide."""

    def __init__(self, matcher: xgr.GrammarMatcher, allowed: torch.Tensor, guard: SurrogateGuard):
        self._matcher = matcher
        self._allowed = allowed  # a bitmask row ANDed into every step's (the guard's; JSON: no control characters)
        self._guard = guard
        self._after_lead = False  # the last token ended in ED

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]``."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
        bitmask[row] &= self._allowed
        if self._after_lead:
            bitmask[row] &= self._guard.after_lead

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (and no change) when the guide does not allow it."""
        if self._after_lead and not int(self._guard.after_lead[token // 32]) >> (token % 32) & 1:
            return False
        accepted = self._matcher.accept_token(token)
        if accepted:
            self._after_lead = token in self._guard.ends_in_lead
        return accepted

    def finished(self) -> bool:
        """The output is complete and the stop token was accepted: the sequence ends here."""
        return self._matcher.is_terminated()


class CompiledGuide:
    def __init__(self, grammar: xgr.CompiledGrammar, guide_type: str, guide: str, allowed: torch.Tensor,
                 guard: SurrogateGuard):
        self._grammar = grammar
        self._allowed, self._guard = allowed, guard
        # The source, for an engine that compiles guides itself (TensorRT-LLM's executor: GuidedDecodingParams).
        self.guide_type, self.guide = guide_type, guide

    def ebnf(self) -> str:
        """The guide as an EBNF grammar (xgrammar's own printing of it, which its EBNF parser reads back)."""
        return str(self._grammar.grammar)

    def matcher(self, end_id: int | None = None) -> Matcher:
        """A fresh matcher. When the guide is complete only the stop token is allowed: ``end_id`` (the request's),
        else the tokenizer's end-of-sequence tokens."""
        return Matcher(xgr.GrammarMatcher(self._grammar, override_stop_tokens=end_id), self._allowed, self._guard)


class Grammars:
    """One model's guide compiler: its tokenizer (``tokenizer.json`` / ``tokenizer_config.json`` in
    ``tokenizer_dir``) over the model's ``vocab_size`` logits (embedding rows, which may exceed the tokenizer's)."""

    def __init__(self, tokenizer_dir: str | Path, vocab_size: int, cache_size: int = CACHE_SIZE):
        # The fast tokenizer's class itself, not AutoTokenizer: that resolves the class through transformers' model
        # registry, which imports torch._dynamo and sympy (+130 MB in the served llm on the first guided request,
        # +47 MB this way, the same vocabulary and metadata). serving/tokenizer.py needs tokenizer.json too.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir), local_files_only=True)
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # JSON allows no raw control character (U+0000-U+001F) in a string, and our JSON guides none outside one
        # (no whitespace but their separators' spaces); xgrammar 0.2.9 lets tokens holding one through inside strings
        # (seen: U+0005, U+0014 in generated strings), which strict parsers refuse. Those tokens are masked out of
        # every step of a json / json_schema guide.
        self.control_tokens = control_tokens(info.decoded_vocab)
        self._guard = SurrogateGuard(info.decoded_vocab, vocab_size)
        self._json_allowed = self._guard.always.clone()
        for token in self.control_tokens:
            _disallow(self._json_allowed, token)
        # One compile thread (it runs on a request thread beside the engine); the cache is ours, keyed by the guide.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cached = functools.lru_cache(maxsize=cache_size)(self._compile)

    def compile(self, guide_type: str, guide: str) -> CompiledGuide:
        """The guide compiled (cached by type and text); GuideError names what is wrong with it."""
        if guide_type not in GUIDE_TYPES:
            raise GuideError(f"guided_decoding_guide_type {guide_type!r} is not one of {', '.join(GUIDE_TYPES)}")
        if guide_type == "json":
            guide = ""  # not used (TensorRT-LLM): one cache entry
        elif not guide.strip():
            raise GuideError(f"{guide_type}: guided_decoding_guide is empty")
        return self._cached(guide_type, guide)

    def _compile(self, guide_type: str, guide: str) -> CompiledGuide:
        compiler = self._compiler
        try:
            if guide_type == "json":
                grammar = compiler.compile_json_schema('{"type": ["object", "array"]}', any_whitespace=False,
                                                       separators=SEPARATORS, strict_mode=False)
            elif guide_type == "json_schema":
                try:
                    schema = json.loads(guide)
                except json.JSONDecodeError as error:
                    raise GuideError(f"json_schema: not JSON: {error}") from None
                check_schema(schema)
                grammar = compiler.compile_json_schema(guide, any_whitespace=False, separators=SEPARATORS,
                                                       strict_mode=True)
            elif guide_type == "regex":
                grammar = compiler.compile_regex(guide)
            elif guide_type == "structural_tag":
                try:
                    tag = json.loads(guide)
                except json.JSONDecodeError as error:
                    raise GuideError(f"structural_tag: not JSON: {error}") from None
                for schema in _schemas_in(tag):
                    try:
                        check_schema(schema)
                    except GuideError as error:
                        raise GuideError(f"structural_tag: {str(error).removeprefix('json_schema: ')}") from None
                grammar = compiler.compile_structural_tag(tag)
            else:
                grammar = compiler.compile_grammar(guide)
        except RuntimeError as error:  # xgrammar's compile errors, with a C++ source location in front
            raise GuideError(f"{guide_type}: {_strip_cxx(error)}") from None
        return CompiledGuide(grammar, guide_type, guide,
                             self._json_allowed if guide_type in ("json", "json_schema") else self._guard.always,
                             self._guard)


def control_tokens(decoded_vocab: list[bytes]) -> list[int]:
    """The tokens whose text holds a control character (a byte below 0x20): never part of the JSON our JSON guides
    allow (``Grammars``)."""
    return [token for token, text in enumerate(decoded_vocab) if any(byte < 0x20 for byte in text)]


def _schemas_in(node: object) -> Iterator[object]:
    """Every ``{"type": "json_schema", "json_schema": ...}`` format's schema inside a structural tag."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and "json_schema" in node:
            yield node["json_schema"]
        for value in node.values():
            yield from _schemas_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas_in(value)


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """int32 [rows, ceil(vocab_size / 32)], all tokens allowed: token t is allowed in row r when bit t % 32 of word
    t // 32 is set (xgrammar's layout, so matchers fill it directly)."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _disallow(row: torch.Tensor, token: int) -> None:
    row[token // 32] &= ~(1 << (token % 32))


_BIT = torch.arange(32, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [B, V] in place: tokens bitmask row b disallows -> -inf. Unpacking the bits in torch and one
    masked_fill_ beats xgrammar's CPU kernel 3x on the restrictive masks of guided rows (bench/grammar_bench.py)."""
    allowed = ((bitmask[:, :, None] >> _BIT) & 1).flatten(1)[:, :logits.shape[-1]].bool()
    logits.masked_fill_(~allowed, float("-inf"))
