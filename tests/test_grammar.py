"""Guided decoding (cpu_engine/grammar.py): every guide type constrains generation; a schema is refused, naming the
problem, exactly when its grammar would let a violating document through; and the issue's acceptance — 200 sampled
generations of the real model against 10 JSON schemas all parse and validate.

Oracles are independent of xgrammar: ``jsonschema`` (with its format checker) for documents, Python's ``re`` for
regexes and for the language of the EBNF grammar, ``json`` for parsing.
"""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
import torch
import xgrammar as xgr

from cpu_engine.grammar import Grammars, GuideError, apply_bitmask, new_bitmask

VALIDATOR = jsonschema.Draft202012Validator


@pytest.fixture(scope="module")
def tokenizer(real_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_checkpoint, local_files_only=True)


@pytest.fixture(scope="module")
def grammars(real_checkpoint):
    vocab = json.loads((real_checkpoint / "config.json").read_text())["vocab_size"]
    return Grammars(real_checkpoint, vocab)


def valid(schema: dict, document) -> bool:
    return VALIDATOR(schema, format_checker=VALIDATOR.FORMAT_CHECKER).is_valid(document)


def accepts(grammars, tokenizer, guide_type: str, guide: str, text: str) -> bool:
    """Whether a matcher takes ``text`` (tokenized the tokenizer's way) followed by the end token, and finishes."""
    matcher = grammars.compile(guide_type, guide).matcher(tokenizer.eos_token_id)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return all(matcher.accept(t) for t in ids) and matcher.accept(tokenizer.eos_token_id) and matcher.finished()


def greedy_under_mask(grammars, tokenizer, guide_type: str, guide: str, seed: int, steps: int = 300) -> str:
    """Random logits each step, the highest allowed token taken: the text when the matcher finishes."""
    generator = torch.Generator().manual_seed(seed)
    matcher = grammars.compile(guide_type, guide).matcher(tokenizer.eos_token_id)
    bitmask = new_bitmask(1, grammars.vocab_size)
    ids = []
    for _ in range(steps):
        logits = torch.randn(1, grammars.vocab_size, generator=generator)
        matcher.fill(bitmask, 0)
        apply_bitmask(logits, bitmask)
        token = int(logits.argmax())
        assert matcher.accept(token)
        if matcher.finished():
            assert token == tokenizer.eos_token_id
            return tokenizer.decode(ids)
        ids.append(token)
    pytest.fail(f"{guide_type} guide did not finish in {steps} tokens: {tokenizer.decode(ids)!r}")


# ---- each guide type constrains ----

BOUNDED = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", 3, None]},
                                            "n": {"type": "integer", "minimum": -5, "maximum": 500},
                                            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                                            "name": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
           "required": ["kind", "n", "tags"]}
PHONE = r"\(?[0-9]{3}\)? [0-9]{3}-[0-9]{4}"
# Sums of small numbers and parenthesised products: its language, as a Python regex, is the oracle.
SUM_EBNF = 'root ::= term (" + " term)*\nterm ::= num | "(" num (" * " num)* ")"\nnum ::= [1-9] [0-9]?'
SUM_LANGUAGE = re.compile(r"(?:N|\(N(?: \* N)*\))(?: \+ (?:N|\(N(?: \* N)*\)))*".replace("N", "[1-9][0-9]?"))


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_guide_yields_valid_json(grammars, tokenizer, seed):
    text = greedy_under_mask(grammars, tokenizer, "json_schema", json.dumps(BOUNDED), seed)
    assert valid(BOUNDED, json.loads(text)), text


@pytest.mark.parametrize("seed", range(4))
def test_regex_guide_yields_a_full_match(grammars, tokenizer, seed):
    assert re.fullmatch(PHONE, greedy_under_mask(grammars, tokenizer, "regex", PHONE, seed))


@pytest.mark.parametrize("seed", range(4))
def test_ebnf_guide_yields_a_sentence_of_the_grammar(grammars, tokenizer, seed):
    text = greedy_under_mask(grammars, tokenizer, "ebnf_grammar", SUM_EBNF, seed)
    assert SUM_LANGUAGE.fullmatch(text), text


@pytest.mark.parametrize("text, ok", [('{"a": [1, {"b": null}], "c": "d"}', True), ("[true, 2.5]", True),
                                      ('{"a": 1}', True), ("1", False), ('"s"', False), ("{'a': 1}", False),
                                      ('{"a": 1,}', False), ('{ "a": 1}', False), ('{"a":1}', False)])
def test_json_guide_takes_an_object_or_array_written_as_json_dumps_does(grammars, tokenizer, text, ok):
    """TensorRT-LLM's ``json``: xgrammar's builtin JSON grammar, whose root is an object or an array; here with
    json.dumps's separators and no other whitespace."""
    assert accepts(grammars, tokenizer, "json", "", text) is ok


def test_mask_allows_exactly_the_next_tokens_of_the_grammar(grammars, tokenizer):
    """The bitmask is read independently of xgrammar: the EBNF below starts with "yes" or "no" only, so every
    allowed token must be a non-empty prefix of one of them."""
    matcher = grammars.compile("ebnf_grammar", 'root ::= "yes" | "no"').matcher(tokenizer.eos_token_id)
    bitmask = new_bitmask(2, grammars.vocab_size)
    matcher.fill(bitmask, 1)
    logits = torch.zeros(2, grammars.vocab_size)
    apply_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).all(), "row 0 was not filled: everything stays allowed"
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all(t and ("yes".startswith(t) or "no".startswith(t)) for t in texts), texts
    assert {"yes", "no"} <= texts


@pytest.mark.parametrize("end_id", [None, 0])
def test_a_complete_output_allows_only_the_stop_token(grammars, tokenizer, end_id):
    """The request's end_id when given, else the tokenizer's end of sequence; accepting it finishes the matcher."""
    matcher = grammars.compile("regex", "ab").matcher(end_id)
    assert all(matcher.accept(t) for t in tokenizer("ab", add_special_tokens=False).input_ids)
    assert not matcher.finished()
    bitmask = new_bitmask(1, grammars.vocab_size)
    matcher.fill(bitmask, 0)
    logits = torch.zeros(1, grammars.vocab_size)
    apply_bitmask(logits, bitmask)
    stop = tokenizer.eos_token_id if end_id is None else end_id
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [stop]
    assert matcher.accept(stop) and matcher.finished()


def test_apply_bitmask_matches_xgrammars_own_kernel(grammars):
    """Our torch unpacking (faster on restrictive masks) against xgrammar's CPU kernel on random bits, a vocabulary
    that is not a multiple of 32 included."""
    generator = torch.Generator().manual_seed(0)
    for vocab in (grammars.vocab_size, 1000):
        bitmask = torch.randint(-2**31, 2**31 - 1, (4, (vocab + 31) // 32), dtype=torch.int32, generator=generator)
        ours, theirs = torch.randn(2, 4, vocab, generator=generator)
        theirs = theirs.copy_(ours)
        apply_bitmask(ours, bitmask)
        xgr.apply_token_bitmask_inplace(theirs, bitmask)
        assert torch.equal(ours, theirs)


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOL_TAG = json.dumps({"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": False, "stop_after_first": False,
    "tags": [{"begin": '<tool_call>{"name": "get_weather", "arguments": ',
              "content": {"type": "json_schema", "json_schema": WEATHER}, "end": "}</tool_call>"}]}})


@pytest.mark.parametrize("text, ok", [
    ("It is sunny.", True),  # free text: no call
    ('Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', True),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": 3}}</tool_call>', False),  # arguments off the schema
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', False),  # no such tool
])
def test_structural_tag_guide_constrains_only_what_follows_its_trigger(grammars, tokenizer, text, ok):
    assert accepts(grammars, tokenizer, "structural_tag", TOOL_TAG, text) is ok


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("parallel", [False, True])
def test_a_tool_guide_as_ebnf_allows_exactly_what_the_tag_allows(grammars, tokenizer, choice, parallel):
    """The GPU layout hands a tool guide to TensorRT-LLM as the EBNF grammar xgrammar prints for it
    (serving/executor_engine.py): reading that text back must give the same language."""
    from serving.tools import tool_guide

    tag = json.dumps(tool_guide([{"name": "get_weather", "parameters": WEATHER}], choice, parallel))
    ebnf = grammars.compile("structural_tag", tag).ebnf()
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert accepts(grammars, tokenizer, "ebnf_grammar", ebnf, call)
    for text in ("It is sunny.", call, "Let me look. " + call, call + call, call[:-3],
                 call.replace('"Paris"', "3")):
        assert accepts(grammars, tokenizer, "ebnf_grammar", ebnf, text) is \
            accepts(grammars, tokenizer, "structural_tag", tag, text), text


def test_a_surrogates_bytes_never_pass_though_xgrammar_takes_them(grammars, tokenizer, real_checkpoint):
    """xgrammar alone takes ED A0 80 (a UTF-16 surrogate's bytes: not UTF-8) as one character of a JSON string (a
    CI run's ``maxLength: 8`` name decoded to 10 characters); our matcher allows neither such a token nor, after a
    token ending in ED, one that starts with A0-BF. The oracle is Python's strict UTF-8 decoder."""
    import xgrammar as xgr

    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
                         "required": ["name"]})
    vocab = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=grammars.vocab_size).decoded_vocab
    bare = xgr.GrammarMatcher(xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_json_schema(schema))
    document = b'{"name": " ==*\xed\xa0\x80xdQ"}'
    assert bare.accept_string(document)  # the upstream bug, still there in the pinned xgrammar
    with pytest.raises(UnicodeDecodeError):
        document.decode("utf-8")

    def allowed_after(prefix: str, last: int | None = None) -> set[int]:
        matcher = grammars.compile("json_schema", schema).matcher(tokenizer.eos_token_id)
        ids = tokenizer(prefix, add_special_tokens=False).input_ids + ([last] if last is not None else [])
        assert all(matcher.accept(t) for t in ids)
        bitmask = new_bitmask(1, grammars.vocab_size)
        matcher.fill(bitmask, 0)
        logits = torch.zeros(1, grammars.vocab_size)
        apply_bitmask(logits, bitmask)
        return set(torch.nonzero(logits[0] == 0).flatten().tolist())

    lead = vocab.index(b"\xed")
    in_string = allowed_after('{"name": " ==*')
    assert lead in in_string  # the lead byte itself may begin a valid character (U+D000-U+D7FF)
    assert not [t for t in in_string if re.search(rb"\xed[\xa0-\xbf]", vocab[t])]
    after_lead = allowed_after('{"name": " ==*', lead)
    assert after_lead and all(0x80 <= vocab[t][0] <= 0x9F for t in after_lead), \
        sorted({vocab[t][:1] for t in after_lead})
    for t in after_lead:  # every way on can still make a valid character
        (b"\xed" + vocab[t][:1] + b"\x80").decode("utf-8")


def test_the_same_guide_compiles_once(grammars):
    schema = json.dumps(BOUNDED)
    assert grammars.compile("json_schema", schema) is grammars.compile("json_schema", schema)
    assert grammars.compile("json", "") is grammars.compile("json", "anything: the guide is not used")
    assert grammars.compile("regex", "a+") is not grammars.compile("regex", "b+")


# ---- what is refused, in words ----

@pytest.mark.parametrize("guide_type, guide, message", [
    ("yaml", "a: 1",
     "guided_decoding_guide_type 'yaml' is not one of json, json_schema, regex, ebnf_grammar, structural_tag"),
    ("structural_tag", "{not json", "structural_tag: not JSON"),
    ("structural_tag", '{"structures": [], "triggers": []}', "structural_tag: "),  # the legacy format: no "format"
    ("structural_tag", json.dumps({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [{
            "begin": "<tool_call>", "end": "</tool_call>",
            "content": {"type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}}}]}}),
     "keyword 'uniqueItems' at the root is not supported"),
    ("regex", "  ", "regex: guided_decoding_guide is empty"),
    ("json_schema", "{not json", "json_schema: not JSON: Expecting property name enclosed in double quotes"),
    ("json_schema", '{"type": "object", "properties": {"a": {"type": 5}}}',
     "json_schema: invalid schema at /properties/a/type: 5 is not valid under any of the given schemas"),
    ("json_schema", '{"required": "a"}', "json_schema: invalid schema at /required: 'a' is not of type 'array'"),
    ("json_schema", '{"type": "array", "uniqueItems": true}',
     "json_schema: keyword 'uniqueItems' at the root is not supported: the grammar engine does not enforce it"),
    ("json_schema", '{"properties": {"not": {"not": {"type": "string"}}}}',
     "json_schema: keyword 'not' at /properties/not is not supported"),
    ("json_schema", '{"if": {"type": "string"}, "then": {"minLength": 2}}', "keyword 'if' at the root"),
    ("json_schema", '{"properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}}',
     "keyword 'dependentRequired' at the root"),
    ("json_schema", '{"dependentSchemas": {"a": {"required": ["b"]}}}', "keyword 'dependentSchemas'"),
    ("json_schema", '{"allOf": [{"required": ["a"]}, {"required": ["b"]}]}',
     "keyword 'allOf' at the root is not supported: only a single subschema is enforced"),
    ("json_schema", '{"oneOf": [{"type": "integer"}, {"type": "number"}]}', "use anyOf"),
    ("json_schema", '{"type": "number", "multipleOf": 0.5}', "enforced only as an integer on type 'integer'"),
    ("json_schema", '{"items": {"type": "string", "format": "hostname"}}',
     "keyword 'format' at /items is not supported: format 'hostname' is not enforced"),
    ("json_schema", '{"$ref": "https://example.com/schema.json"}',
     "only references inside the schema (#/...) are followed, not 'https://example.com/schema.json'"),
    ("json_schema", '{"type": "array", "contains": {"type": "integer"}}', "keyword 'contains' at the root"),
    ("json_schema", '{"type": "array", "minContains": 2}', "keyword 'minContains'"),
    ("json_schema", '{"type": "object", "unevaluatedProperties": false}', "keyword 'unevaluatedProperties'"),
    ("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}',
     "json_schema: Invalid range: minimum greater than maximum"),
    ("json_schema", '{"$ref": "#/$defs/missing"}', "json_schema: Cannot find field '$defs' in #/$defs/missing"),
    ("regex", "(abc", "regex: Regex parsing error at position 5: The parenthesis is not closed."),
    ("regex", "(?=a)b", "regex: Regex parsing error at position 3: Lookahead is not supported yet."),
    ("ebnf_grammar", "root ::= foo", 'ebnf_grammar: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    ("ebnf_grammar", 'start ::= "a"',
     'ebnf_grammar: EBNF parser error at line 1, column 1: The root rule with name "root" is not found'),
])
def test_refusal_names_the_problem(grammars, guide_type, guide, message):
    with pytest.raises(GuideError) as error:
        grammars.compile(guide_type, guide)
    assert message in str(error.value)
    assert "/project/cpp" not in str(error.value) and not str(error.value).startswith("[")


@pytest.fixture(scope="module")
def xgrammar_compiler(grammars, tokenizer):
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=grammars.vocab_size)
    return xgr.GrammarCompiler(info, max_threads=1)


# Why those keywords are refused: xgrammar itself compiles each and then takes a document that violates it (the
# oracle: jsonschema). When one of these starts failing, xgrammar enforces that keyword now and it can be allowed.
@pytest.mark.parametrize("schema, document", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    ({"not": {"type": "string"}}, '"s"'),
    ({"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}}, '"a"'),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a": 1}'),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    ({"type": "number", "multipleOf": 0.5}, "0.3"),
    ({"type": "string", "format": "regex"}, '"("'),
])
def test_xgrammar_alone_lets_a_violation_of_each_refused_keyword_through(grammars, xgrammar_compiler, schema,
                                                                        document):
    assert not valid(schema, json.loads(document))
    compiled = xgrammar_compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(document) and matcher.is_completed()
    with pytest.raises(GuideError):
        grammars.compile("json_schema", json.dumps(schema))


# Every keyword accepted is enforced: a document the oracle calls invalid never gets through (one that is valid may
# be refused: patterns match whole strings, numbers and enum members come out in one canonical spelling).
ENFORCED_CASES = [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     ['{"a": 1}', "{}", '{"a": "1"}', '{"a": 1, "b": 2}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     ['{"a": 1, "b": "x"}', '{"b": 2}']),
    ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2, "maxProperties": 2},
     ['{"a": 1}', '{"a": 1, "b": 2}', '{"a": 1, "b": 2, "c": 3}']),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
     ['{"x": 1}', '{"x1": "s"}', '{"y": 1}']),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, ['{"ab": 1}', '{"abc": 1}']),
    ({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
     ['["a"]', "[]", '["a", "b", "c"]', "[1]"]),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, ['[1, "a"]', "[1, 2]"]),
    ({"enum": ["a", 1, None, True]}, ['"a"', "1", "null", "true", '"b"', "2", "false"]),
    ({"const": "x"}, ['"x"', '"y"']),
    ({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]}, ['"a"', "1", '"ab"', "1.5"]),
    ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "integer", "minimum": 3}}}, ["3", "2"]),
    ({"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
      "$ref": "#/$defs/n"}, ['{"c": [{"c": []}]}', '{"c": [1]}']),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"a"', '"abcd"', '"éé"', '"éééé"']),
    ({"type": "string", "pattern": "^[a-c]+$"}, ['"abc"', '"abd"']),
    ({"type": "integer", "minimum": -3, "exclusiveMaximum": 10, "multipleOf": 3}, ["-3", "9", "10", "12", "4", "-6"]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 2.5}, ["0.1", "2.5", "0", "-1", "2.6"]),
    ({"type": ["string", "null"]}, ['"s"', "null", "1"]),
    ({"type": "string", "format": "date"}, ['"2024-02-29"', '"2024-13-01"', '"x"']),
    ({"type": "string", "format": "email"}, ['"a@b.co"', '"ab.co"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"', '"123e4567"']),
    ({"type": "string", "format": "ipv4"}, ['"10.0.0.1"', '"10.0.0"', '"256.0.0.1"']),
    ({"type": "boolean"}, ["true", "0"]),
]


@pytest.mark.parametrize("schema, documents", ENFORCED_CASES, ids=[json.dumps(s)[:60] for s, _ in ENFORCED_CASES])
def test_accepted_keywords_are_enforced(grammars, tokenizer, schema, documents):
    guide = json.dumps(schema)
    verdicts = {d: (valid(schema, json.loads(d)), accepts(grammars, tokenizer, "json_schema", guide, d))
                for d in documents}
    let_through = [d for d, (ok, taken) in verdicts.items() if taken and not ok]
    assert not let_through, f"invalid documents accepted: {let_through}"
    assert any(taken for _, taken in verdicts.values()), f"no valid document accepted at all: {verdicts}"
    assert not all(ok for ok, _ in verdicts.values()), "the case has no violating document"


# ---- the acceptance: 200 sampled generations of the real model against 10 schemas ----

def _obj(required: list[str] | None = None, **properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required}


NAME = {"type": "string", "maxLength": 20}
SCHEMAS = [
    _obj(name=NAME, age={"type": "integer", "minimum": 0, "maximum": 120}),
    _obj(color={"enum": ["red", "green", "blue"]}, size={"enum": ["S", "M", "L", "XL"]}, in_stock={"type": "boolean"}),
    _obj(scores={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 1,
                 "maxItems": 4}),
    _obj(user=_obj(id={"type": "integer", "minimum": 1, "maximum": 99999}, name=NAME), active={"type": "boolean"}),
    _obj(price={"type": "number", "minimum": 0, "maximum": 1000}, quantity={"type": "integer", "minimum": 1,
                                                                            "maximum": 99}),
    _obj(items={"type": "array", "maxItems": 3,
                "items": _obj(name={"type": "string", "maxLength": 12},
                              qty={"type": "integer", "minimum": 1, "maximum": 9})}),
    _obj(["title"], title={"type": "string", "maxLength": 30},
         rating={"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "null"}]}),
    _obj(event=NAME, date={"type": "string", "format": "date"}),
    _obj(shape={"const": "point"}, at=_obj(x={"type": "integer", "minimum": -100, "maximum": 100},
                                           y={"type": "integer", "minimum": -100, "maximum": 100})),
    _obj(city={"type": "string", "maxLength": 15}, zip={"type": "string", "pattern": "^[0-9]{5}$"},
         tags={"type": "array", "items": {"enum": ["old", "big", "coastal", "cold"]}, "minItems": 1, "maxItems": 3}),
]
PER_SCHEMA = 20
ROWS = 16
MAX_NEW_TOKENS = 160


PROMPT = "Give one example, as a JSON object with the keys {keys}."


@pytest.fixture(scope="module")
def real_engine(real_engine_dir):
    from cpu_engine.engine_dir import load_engine

    return load_engine(real_engine_dir)


def test_200_sampled_generations_all_parse_and_validate(real_engine, grammars, tokenizer):
    """Through the engine (in-flight batching, 16 rows): temperature 0.7, a distinct seed per generation."""
    from cpu_engine.engine import EngineLimits, LLMEngine
    from cpu_engine.sampling import SamplingParams
    from cpu_engine.scheduler import FinishReason, GenerationRequest

    requests = []
    for seed in range(PER_SCHEMA):
        for n, schema in enumerate(SCHEMAS):
            messages = [{"role": "user", "content": PROMPT.format(keys=", ".join(schema["properties"]))}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            requests.append((schema, GenerationRequest(
                f"{n}-{seed}", ids, MAX_NEW_TOKENS, SamplingParams(temperature=0.7, top_k=0, seed=seed),
                end_id=tokenizer.eos_token_id, guide=grammars.compile("json_schema", json.dumps(schema)))))
    tokens = {r.request_id: [] for _, r in requests}
    reasons = {}
    done = threading.Event()

    def on_event(event):
        if event.token_id is not None:
            tokens[event.request_id].append(event.token_id)
        if event.finish_reason is not None:
            reasons[event.request_id] = event.finish_reason
            if len(reasons) == len(requests):
                done.set()

    longest = max(len(r.prompt_ids) for _, r in requests)
    limits = EngineLimits(max_batch_size=ROWS, max_seq_len=longest + MAX_NEW_TOKENS, max_num_tokens=256,
                          max_queue_size=len(requests))
    engine = LLMEngine(real_engine.model, limits, on_event, dtype=real_engine.compute_dtype).start()
    try:
        for _, request in requests:
            engine.submit(request)
        assert done.wait(600), f"{len(reasons)} of {len(requests)} generations finished in 10 minutes"
    finally:
        engine.shutdown(timeout=10)
    texts, failures = [], []
    for schema, request in requests:
        text = tokenizer.decode(tokens[request.request_id])
        texts.append(text)
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            failures.append(f"{text!r} ({reasons[request.request_id].value}): {error}")
            continue
        if reasons[request.request_id] != FinishReason.STOP or not valid(schema, document):
            failures.append(f"{text!r}: does not validate against {json.dumps(schema)}")
    assert len(texts) == 200
    assert not failures, "\n".join(failures)
    assert len(set(texts)) > len(SCHEMAS), "sampling with distinct seeds gave the same outputs"
