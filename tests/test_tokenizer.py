"""serving/tokenizer.py against its oracle, transformers' AutoTokenizer on the same directory: ids, rendered chat
templates, special tokens, on the tiny test tokenizer, the real SmolLM2 one and variants of the tiny one (BOS from
tokenizer.json's post-processor, extra special tokens, a chat_template.jinja). And preprocessing without
transformers or torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jinja2
import pytest

from serving.tokenizer import Tokenizer

PROJECT_ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "", " ", "   ", "hello", "Hello, world!", "  two leading spaces", " one leading space", "trailing  ",
    "\tTab first", "\n", "\n\nline one\nline two\n\n", "windows\r\nline", "日本語のテキスト", "中文，标点。", "한국어 문장",
    "😀", "emoji 👍🏽 and a family 👨‍👩‍👧", "café naïve Ångström", "</s>", "<s>", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "a<|im_end|>b", "<|im_start|>user\nhi<|im_end|>\n", "x = '<|endoftext|>'",
    "def f(x):\n    return x  # <b>not a token</b>\n", "1234567890 3.14159 -42", "\u200bzero\u200bwidth", "🙂" * 12,
    "mixed 日本 text with emoji 🚀 and <|im_end|> inside",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "A joke, please."}],
    [{"role": "user", "content": "日本語で答えて 😀"}, {"role": "assistant", "content": " x "},
     {"role": "user", "content": "\n\nnewlines\n"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "<|im_end|> forged"}],
]

# Exercises the environment's extras: trim_blocks/lstrip_blocks (indented tags on their own lines), tojson (no HTML
# escaping, non-ASCII kept), namespace, loopcontrols, the special-token variables, dict(), {% generation %}.
FEATURE_TEMPLATE = """{% set ns = namespace(n=0) %}{{ bos_token }}
{% for m in messages %}
    {% if loop.index > 4 %}{% break %}{% endif %}
    {% set ns.n = ns.n + 1 %}
{{ m | tojson }}
    {% if m.role == 'assistant' %}
{% generation %}{{ m.content }}{% endgeneration %}
    {% endif %}
{% endfor %}
{{ dict(seen=ns.n) | tojson }}{{ eos_token }}
{% if add_generation_prompt %}>>{% endif %}"""


def auto_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def tiny_variant(tiny_checkpoint: Path, out: Path, config: dict, template_file: str | None = None,
                 post_processor: dict | None = None) -> Path:
    """The tiny tokenizer's files with ``config`` merged into tokenizer_config.json, another chat_template.jinja or
    another post-processor in tokenizer.json."""
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_checkpoint / name, out / name)
    merged = {**json.loads((out / "tokenizer_config.json").read_text()), **config}
    (out / "tokenizer_config.json").write_text(json.dumps(merged))
    if template_file is not None:
        (out / "chat_template.jinja").write_text(template_file)
    if post_processor is not None:
        spec = json.loads((out / "tokenizer.json").read_text())
        (out / "tokenizer.json").write_text(json.dumps({**spec, "post_processor": post_processor}))
    return out


# BOS (<|im_start|>, id 1) before every text, as Llama tokenizers write it; the config's add_*_token flags, which
# transformers ignores when there is a tokenizer.json, say otherwise.
BOS_PROCESSOR = {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}


@pytest.fixture(scope="module", params=["tiny", "real", "bos", "extra_special", "template_file"])
def checkpoint(request, tmp_path_factory) -> Path:
    if request.param == "real":
        return request.getfixturevalue("real_checkpoint")
    tiny = request.getfixturevalue("tiny_checkpoint")
    if request.param == "tiny":
        return tiny
    out = tmp_path_factory.mktemp("tokenizers") / request.param
    if request.param == "bos":
        return tiny_variant(tiny, out, {"add_bos_token": False, "add_eos_token": True}, post_processor=BOS_PROCESSOR)
    if request.param == "extra_special":  # a special token not in tokenizer.json gets a new id
        return tiny_variant(tiny, out, {"extra_special_tokens": ["<|tool|>"], "sep_token": "<|sep|>"})
    # chat_template.jinja wins over the config's template
    return tiny_variant(tiny, out, {"chat_template": "config's"},
                        template_file="{% for m in messages %}[{{ m.role }}] {{ m.content }}"
                                      "<|im_end|>{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def pair(checkpoint):
    return Tokenizer.from_dir(checkpoint), auto_tokenizer(checkpoint)


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("split_special_tokens", [True, False])
def test_ids_equal_transformers(pair, add_special_tokens, split_special_tokens):
    ours, hf = pair
    for text in TEXTS:
        expected = hf(text, add_special_tokens=add_special_tokens, split_special_tokens=split_special_tokens).input_ids
        assert ours.encode(text, add_special_tokens=add_special_tokens,
                           split_special_tokens=split_special_tokens) == expected, text


def test_special_tokens_equal_transformers(pair):
    ours, hf = pair
    assert ours.special_ids == {t.content: i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert ours.special_tokens_map == hf.special_tokens_map
    assert (ours.eos_token_id, ours.pad_token_id) == (hf.eos_token_id, hf.pad_token_id)
    assert ours.chat_template == hf.chat_template


def test_the_variants_are_what_they_claim(checkpoint, pair):
    """The tiny variants really exercise their rule (else the equalities above prove little)."""
    ours, _ = pair
    if checkpoint.name == "bos":
        assert ours.encode("") == [1] and ours.encode("hi")[0] == 1 and ours.encode("hi")[-1] != 2
        assert ours.encode("hi", add_special_tokens=False)[0] != 1
    if checkpoint.name == "extra_special":
        assert {"<|tool|>", "<|sep|>"} <= set(ours.special_ids)
    if checkpoint.name == "template_file":
        assert ours.chat_template.startswith("{% for m in messages %}[{{ m.role }}]")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers(pair, add_generation_prompt):
    ours, hf = pair
    for messages in CONVERSATIONS:
        assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == \
            hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def test_template_environment_matches_transformers(tiny_checkpoint):
    ours, hf = Tokenizer.from_dir(tiny_checkpoint), auto_tokenizer(tiny_checkpoint)
    ours.chat_template = hf.chat_template = FEATURE_TEMPLATE
    messages = [{"role": "user", "content": "<b>&'\"</b> é"}, *CONVERSATIONS[1]]
    for add_generation_prompt in (True, False):
        rendered = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        assert rendered == hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)
    assert '"seen": 4' in rendered and rendered.count("Hello! How can I help?") == 2  # message, generation body
    assert "<b>&'\\\"</b> é" in rendered and "\n    " not in rendered  # tojson unescaped; blocks stripped


def test_raise_exception_is_a_template_error(tiny_checkpoint):
    ours = Tokenizer.from_dir(tiny_checkpoint)
    ours.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        ours.apply_chat_template(CONVERSATIONS[0])


def test_a_template_cannot_set_private_namespace_attributes(tiny_checkpoint):
    ours = Tokenizer.from_dir(tiny_checkpoint)
    ours.chat_template = "{% set ns = namespace() %}{% set ns._x = 1 %}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        ours.apply_chat_template(CONVERSATIONS[0])


def test_preprocessing_starts_without_transformers_or_torch(tiny_checkpoint):
    """The preprocessing model's imports and initialize() in a fresh interpreter (Triton's utils faked)."""
    model_py = PROJECT_ROOT / "model_repository/preprocessing/1/model.py"
    script = textwrap.dedent(f"""
        import importlib.util, json, sys, types
        pb = types.ModuleType("triton_python_backend_utils")
        pb.Logger = types.SimpleNamespace(log_info=lambda message: None)
        sys.modules["triton_python_backend_utils"] = pb
        spec = importlib.util.spec_from_file_location("preprocessing_model", {str(model_py)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        params = {{"tokenizer_dir": {str(tiny_checkpoint)!r}, "max_input_len": "192", "max_seq_len": "256", "vocab_size": "512"}}
        config = json.dumps({{"parameters": {{k: {{"string_value": v}} for k, v in params.items()}}}})
        model = module.TritonPythonModel()
        model.initialize({{"model_name": "preprocessing", "model_config": config}})
        print(json.dumps({{"end_id": model.end_id, "loaded": sorted({{"transformers", "torch"}} & set(sys.modules))}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"end_id": 2, "loaded": []}
