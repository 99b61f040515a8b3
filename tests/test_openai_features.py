"""Issue 17 through the OpenAI front door with the official ``openai`` SDK: log-probs, n > 1, penalties, min_p and
structured output (``response_format``), and each bad value's 400. The first tests need no server: they pin how a
choice's text and its tokens' log-probs are cut and aligned (serving/openai/streaming.py ``ChoiceText``).

The tiny model's weights are random, so its text is noise; what is checked holds for any model: streamed equals
non-streamed, greedy picks the most likely token (its log-prob is the top alternative's), ``min_p = 1`` keeps only
the most likely token (so it equals greedy), a guided output parses and validates with ``jsonschema``. The GPU layout
refuses ``top_logprobs`` (TensorRT-LLM's executor returns the chosen tokens' log-probs only): a test pins the refusal.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import jsonschema
import openai
import pytest

from client import TokenLogprob
from serving.openai.streaming import ChoiceText
from tests.openai_front import FrontDoorProcess

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

CHAT = [{"role": "user", "content": "List the colours: red, green, blue, red, green, blue, red, green,"}]
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["colour", "ok"], "additionalProperties": False}


def token(text: bytes) -> TokenLogprob:
    return TokenLogprob(token=text.decode("utf-8", errors="replace"), bytes=text, logprob=-1.0)


# --------------------------------------------------------------------------------- alignment (no server needed)

EURO = "€".encode()  # 3 bytes
TOKENS = [token(b"ab"), token(b" c"), token(EURO[:1]), token(EURO[1:]), token(b"d"), token(b"STOP"), token(b"e")]
TEXT = "ab c€dSTOPe"


def released(pieces: list[tuple[str, list[TokenLogprob]]], stops: list[str]):
    """Feed a stream's pieces; return the text and (offset, token bytes) handed out with each piece, then at the end."""
    choice = ChoiceText(stops)
    out = []
    for text, tokens in pieces:
        sent, with_tokens = choice.feed(text, tokens)
        out.append((sent, [(offset, t.bytes) for offset, t in with_tokens]))
    sent, with_tokens = choice.finish()
    out.append((sent, [(offset, t.bytes) for offset, t in with_tokens]))
    return out, choice.stopped


def test_a_token_goes_out_with_the_chunk_that_carries_its_last_character():
    # The server's chunks: "ab c" (2 tokens), "€" (2 tokens: one character split), "dSTOPe" (3 tokens).
    pieces = [("ab c", TOKENS[:2]), ("€", TOKENS[2:4]), ("dSTOPe", TOKENS[4:])]
    out, stopped = released(pieces, [])
    assert not stopped
    assert out == [("ab c", [(0, b"ab"), (2, b" c")]), ("€", [(4, EURO[:1]), (4, EURO[1:])]),
                   ("dSTOPe", [(5, b"d"), (6, b"STOP"), (10, b"e")]), ("", [])]


def test_a_stop_string_cuts_the_text_and_drops_the_tokens_wholly_after_the_cut():
    whole, _ = released([(TEXT, TOKENS)], ["OP"])
    # The text ends before "OP"; "STOP" began before the cut (its "ST" is sent), "e" lies wholly after it.
    assert whole == [("ab c€dST", [(0, b"ab"), (2, b" c"), (4, EURO[:1]), (4, EURO[1:]), (5, b"d"), (6, b"STOP")]),
                     ("", [])]


@pytest.mark.parametrize("stops", [[], ["OP"], ["d"], ["€"], ["x"], ["Pe"]])
def test_streamed_pieces_give_the_same_text_and_tokens_as_the_whole(stops):
    whole, whole_stopped = released([(TEXT, TOKENS)], stops)
    streamed, stopped = released([(t.bytes.decode("utf-8", errors="ignore"), [t]) if i not in (2, 3) else
                                  ("€" if i == 3 else "", [t]) for i, t in enumerate(TOKENS)], stops)
    assert stopped == whole_stopped
    assert "".join(text for text, _ in streamed) == "".join(text for text, _ in whole)
    assert [pair for _, tokens in streamed for pair in tokens] == [pair for _, tokens in whole for pair in tokens]


def test_text_held_back_for_a_possible_stop_string_holds_its_tokens_back_too():
    choice = ChoiceText(["STOP"])
    assert choice.feed("dST", [token(b"d"), token(b"ST")]) == ("d", [(0, TOKENS[4])])
    assert choice.feed("x", [token(b"x")]) == ("STx", [(1, token(b"ST")), (3, token(b"x"))])


# --------------------------------------------------------------------------------------------- the live stack

MODEL = "tiny"


def gpu_layout(triton) -> bool:
    return triton.layout != "cpu"


def utf8(raw: bytes) -> str:
    """Text of token bytes as the stack writes it (a character cut off at the end reads U+FFFD)."""
    return raw.decode("utf-8", errors="replace")


def content_logprobs(choice) -> list[tuple[str, list[int], float, list[tuple[str, float]]]]:
    return [(t.token, t.bytes, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
            for t in choice.logprobs.content]


def test_chat_logprobs_streamed_equal_non_streamed_and_greedy_picks_the_top_alternative(sdk, triton):
    top = 0 if gpu_layout(triton) else 3
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=16, logprobs=True, top_logprobs=top)
    whole = sdk.chat.completions.create(**kwargs).choices[0]
    tokens = content_logprobs(whole)
    assert len(tokens) >= 1
    assert utf8(b"".join(bytes(b) for _, b, _, _ in tokens)) == whole.message.content
    for text, _, logprob, alternatives in tokens:
        assert logprob <= 0 and len(alternatives) == top
        if alternatives:  # greedy: the chosen token is the most likely one (raw-logit log-probs)
            assert [a for _, a in alternatives] == sorted((a for _, a in alternatives), reverse=True)
            assert alternatives[0][1] == pytest.approx(logprob, abs=1e-5)
    chunks = list(sdk.chat.completions.create(**kwargs, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in content_logprobs(c.choices[0])]
    assert [(t, b) for t, b, _, _ in streamed] == [(t, b) for t, b, _, _ in tokens]
    assert [lp for _, _, lp, _ in streamed] == pytest.approx([lp for _, _, lp, _ in tokens], abs=1e-5)
    for chunk in chunks:  # each chunk's log-probs are the tokens whose text it carries
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].delta.content:
            chunk_bytes = b"".join(bytes(t.bytes) for t in chunk.choices[0].logprobs.content)
            assert utf8(chunk_bytes) == chunk.choices[0].delta.content


def test_no_logprobs_unless_asked(sdk):
    assert sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4).choices[0].logprobs is None
    assert sdk.completions.create(model=MODEL, prompt="x", max_tokens=4).choices[0].logprobs is None


def test_completions_legacy_logprobs(sdk, triton):
    top = 0 if gpu_layout(triton) else 2
    kwargs = dict(model=MODEL, prompt="red, green, blue, red,", max_tokens=12, logprobs=top)
    choice = sdk.completions.create(**kwargs).choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == \
        len(logprobs.text_offset) >= 1
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    for text, logprob, alternatives in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert alternatives[text] == pytest.approx(logprob, abs=1e-5)  # the chosen token is always in the dict
        assert len(alternatives) <= top + 1
        assert max(alternatives.values()) == pytest.approx(logprob, abs=1e-5)  # greedy
    chunks = list(sdk.completions.create(**kwargs, stream=True))
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == logprobs.tokens
    assert [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset] == \
        logprobs.text_offset


def test_greedy_n_gives_identical_choices_and_usage_counts_every_choice(sdk):
    one = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    three = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, n=3, temperature=0)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert {c.finish_reason for c in three.choices} == {one.choices[0].finish_reason}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_n_without_temperature_samples_as_openai_does(sdk):
    """Greedy is this server's default, but n choices that could only be equal would be a useless answer: n > 1
    without temperature or top_p samples at OpenAI's default temperature 1."""
    three = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, n=3, seed=3)
    assert len({c.message.content for c in three.choices}) > 1


def test_sampled_n_with_a_seed_gives_n_choices_reproducibly(sdk):
    def sample():
        done = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, n=3, temperature=1.0, seed=11)
        return [c.message.content for c in done.choices]

    first = sample()
    assert len(first) == 3 and len(set(first)) > 1  # independent sequences (seed + index)
    assert sample() == first


def test_streamed_n_interleaves_choices_by_index(sdk):
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=12, n=3, temperature=1.0, seed=5)
    whole = sdk.chat.completions.create(**kwargs)
    chunks = list(sdk.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    texts, reasons = {}, {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                assert choice.index not in reasons  # one finish per choice
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].usage == whole.usage


@pytest.mark.parametrize("penalty", [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                                     {"extra_body": {"repetition_penalty": 3.0}}])
def test_penalties_change_a_repetitive_greedy_output(sdk, penalty):
    def answer(**fields):
        return sdk.completions.create(model=MODEL, prompt="red green blue " * 6, max_tokens=24, **fields)

    plain, penalised = answer(), answer(**penalty)
    assert penalised.choices[0].text != plain.choices[0].text
    assert answer(**penalty).choices[0].text == penalised.choices[0].text  # still deterministic (greedy)
    neutral = {"presence_penalty": 0.0} if "presence_penalty" in penalty else {"frequency_penalty": 0.0}
    assert answer(**neutral).choices[0].text == plain.choices[0].text


def test_min_p_one_keeps_only_the_most_likely_token(sdk, triton):
    """Both layouts: the GPU layout passes min_p to TensorRT-LLM's SamplingConfig."""
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=12)
    greedy = sdk.chat.completions.create(**kwargs).choices[0].message.content
    sampled = sdk.chat.completions.create(**kwargs, temperature=1.0, seed=3, extra_body={"min_p": 1.0})
    assert sampled.choices[0].message.content == greedy


def test_top_logprobs_are_refused_on_the_gpu_layout(sdk, triton):
    if not gpu_layout(triton):
        pytest.skip("the CPU layout returns alternatives (test_chat_logprobs_...)")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, logprobs=True, top_logprobs=2)
    assert refused.value.param == "top_logprobs" and "top_logprobs" in refused.value.message
    with pytest.raises(openai.BadRequestError) as legacy:  # the legacy endpoint's name for it
        sdk.completions.create(model=MODEL, prompt="x", max_tokens=4, logprobs=2)
    assert legacy.value.param == "logprobs" and "top_logprobs" in legacy.value.message


JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}
@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_output_validates(sdk, triton, stream):
    response_format = JSON_SCHEMA
    result = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=64, n=2, temperature=1.0, seed=2,
                                         response_format=response_format, stream=stream)
    if stream:
        texts = {}
        for chunk in result:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        texts = list(texts.values())
    else:
        assert {c.finish_reason for c in result.choices} == {"stop"}
        texts = [c.message.content for c in result.choices]
    assert len(texts) == 2
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_response_format_json_object_output_parses(sdk, triton):
    done = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=64,
                                       response_format={"type": "json_object"})
    choice = done.choices[0]
    assert choice.message.content.startswith("{")  # an object, as OpenAI's JSON mode answers
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: what there is must still be the beginning of a JSON text
        assert completes_to_json(choice.message.content), choice.message.content


def completes_to_json(prefix: str) -> bool:
    """Whether some short ending (closing a literal, string, key or number, then the open brackets) makes ``prefix``
    parse as JSON: the oracle for output that max_tokens cut."""
    closers, in_string, escaped = [], False, False
    for ch in prefix:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch in "[{":
            closers.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if not closers:
                return False
            closers.pop()
        elif ch == '"':
            in_string = True
    ends = ["", "0", '"', '":0', ":0", "l", "ll", "ull", "e", "ue", "rue", "se", "lse", "alse", "0:0", '"0"']
    if in_string:
        ends = ['"', '":0', '"]', '0"', '0":0']
    return any(_parses(prefix + end + "".join(reversed(closers))) for end in ends)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_the_json_prefix_oracle():
    for good in ('[1, null, nul', '{"a": [tr', '{"ke', '{"key"', '[1, ', '{"a": "x\\"y', '[-', '[1.5e'):
        assert completes_to_json(good), good
    for bad in ('[1, ]', '{"a" 1', 'nulx', '[}', '{1', ']'):
        assert not completes_to_json(bad), bad


@pytest.mark.parametrize("schema, fragment", [({"type": "foo"}, "foo"),  # invalid
                                              ({"type": "array", "uniqueItems": True}, "uniqueItems")])  # unenforced
def test_a_schema_the_engine_cannot_compile_is_400_naming_the_problem(sdk, triton, schema, fragment):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as bad:
            result = sdk.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=4, stream=stream,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            list(result) if stream else None
        assert bad.value.param == "response_format" and fragment in bad.value.message, bad.value.message


def test_out_of_range_values_are_400_naming_the_parameter(sdk):
    cases = [({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -2.01}, "frequency_penalty"),
             ({"n": 9}, "n"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
             ({"extra_body": {"repetition_penalty": -1}}, "repetition_penalty"),
             ({"extra_body": {"min_p": 2}}, "min_p")]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, **fields)
        assert bad.value.param == param and param in bad.value.message, (fields, bad.value.message)


def test_logit_bias_forces_a_token_and_bans_one(sdk, tiny_checkpoint):
    """OpenAI's logit_bias (token id → -100..100), on both layouts (the GPU one: TensorRT-LLM's embedding_bias). The
    oracle: transformers' logits of the same checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        ranked = model(torch.tensor([vocab("Hello", split_special_tokens=True).input_ids])).logits[0, -1].argsort(
            descending=True).tolist()

    def answer(max_tokens=4, **fields):
        return sdk.completions.create(model=MODEL, prompt="Hello", max_tokens=max_tokens, **fields).choices[0].text

    for token in (42, 43):  # +100: that token every step
        assert answer(logit_bias={str(token): 100}) == vocab.decode([token] * 4)
    assert answer(logit_bias={"42": 100, "44": 0}) == answer(logit_bias={"42": 100})  # zero changes nothing
    assert answer(1) == vocab.decode(ranked[:1])
    assert answer(1, logit_bias={str(ranked[0]): -100}) == vocab.decode(ranked[1:2])  # banned: the runner-up


# --------------------------------------------------------------------------------------------------- the CLI

def test_cli_n_logprobs_penalty_and_json_schema(triton, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))

    def cli(*flags):
        return subprocess.run([sys.executable, "-m", "client", "generate", "A colour as JSON:", "--url",
                               triton.urls.grpc, "-n", "2", "--temperature", "1.0", "--seed", "4", "--presence-penalty",
                               "0.5", "--logprobs", "--max-tokens", "64", "--json", *flags],
                              capture_output=True, text=True, timeout=120)

    run = cli("--json-schema", str(schema))
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [line["index"] for line in lines] == [0, 1]
    for line in lines:
        if not gpu_layout(triton):
            jsonschema.validate(json.loads(line["text"]), SCHEMA)
        assert utf8(b"".join(bytes(t["bytes"]) for t in line["logprobs"])) == line["text"]
        assert line["cum_log_prob"] == pytest.approx(sum(t["logprob"] for t in line["logprobs"]), abs=1e-3)
        assert all(math.isfinite(t["logprob"]) for t in line["logprobs"])


# ------------------------------------------------------------------------------------- the real default model

def test_real_model_json_schema_answers_validate_with_their_logprobs(real_triton):
    """SmolLM2-135M-Instruct through the SDK: two sampled answers held to a schema, both whole and valid."""
    door = FrontDoorProcess(real_triton.urls.grpc, extra_args=("--served-model-name", "smollm2"))
    try:
        with openai.OpenAI(base_url=door.v1, api_key="x", max_retries=0) as sdk:
            done = sdk.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Pick a colour and say if you like it."}],
                max_tokens=48, n=2, temperature=0.7, seed=1, logprobs=True, top_logprobs=2, response_format=JSON_SCHEMA)
    finally:
        assert door.stop() == 0, "".join(door.output)
    assert [c.index for c in done.choices] == [0, 1] and {c.finish_reason for c in done.choices} == {"stop"}
    for choice in done.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert utf8(b"".join(bytes(t.bytes) for t in choice.logprobs.content)) == choice.message.content
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in choice.logprobs.content)
