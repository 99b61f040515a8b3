"""A checkpoint's tokenizer without transformers: ``tokenizer.json`` through the ``tokenizers`` package and the chat
template through jinja2, with the rules transformers 5 applies when it loads the same directory (its
``TokenizersBackend``, the class it writes for every tokenizer it saves) and renders the template
(``apply_chat_template``). transformers (which imports torch) and its AutoTokenizer cost each preprocessing instance
~2.8 CPU-seconds at start; this ~0.2 (measured here on 2 cores).

Only what serving uses: ``encode``, ``apply_chat_template`` to a string, the special added tokens and the
eos/pad ids. Model-specific tokenizer classes (those that rebuild the tokenizer from a vocabulary in Python) are not
reproduced: ``tokenizer.json`` is taken as it is. tests/test_tokenizer.py compares every answer with transformers'.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import jinja2.utils
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend


class Tokenizer:
    """One checkpoint directory's tokenizer (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``)."""

    def __init__(self, backend: Backend, config: dict[str, Any], chat_template: str | None):
        self._backend = backend
        # Calls without padding or truncation, as transformers' own calls make them (it resets what the file sets).
        backend.no_padding()
        backend.no_truncation()
        #: The ``{bos,eos,...}_token`` strings a chat template sees as variables.
        self.special_tokens_map = _named_special_tokens(config)
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
        if isinstance(extra, dict):  # named model-specific tokens (multimodal): template variables too
            self.special_tokens_map.update({k: _content(v) for k, v in extra.items()})
            extra = []
        # transformers makes every named and extra special token a special added token (new ones get new ids).
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in [*self.special_tokens_map.values(), *map(_content, extra)]])
        self.chat_template = chat_template
        #: Control tokens: the special added tokens, content → id.
        self.special_ids = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self.eos_token_id = self.token_id(self.special_tokens_map.get("eos_token"))
        self.pad_token_id = self.token_id(self.special_tokens_map.get("pad_token"))

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> Tokenizer:
        """Load as ``AutoTokenizer.from_pretrained(tokenizer_dir)`` does for a ``tokenizer.json`` checkpoint."""
        path = Path(tokenizer_dir)
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        template_file = path / "chat_template.jinja"  # takes precedence over the config's, as in transformers
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
        if isinstance(template, list):  # the older form: named templates; serving uses the default one
            template = {t["name"]: t["template"] for t in template}.get("default")
        return cls(Backend.from_file(str(path / "tokenizer.json")), config, template)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens``: what tokenizer.json's post-processor adds (a BOS, say);
        transformers ignores the config's add_bos_token/add_eos_token when there is a tokenizer.json, and so do we.
        ``split_special_tokens``: special tokens written in ``text`` are text (non-special added tokens still match).
        """
        self._backend.encode_special_tokens = split_special_tokens
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens included (as transformers' ``decode`` by default)."""
        return self._backend.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        """The conversation rendered by the chat template, as ``apply_chat_template(tokenize=False, tools=...,
        **template_kwargs)`` renders it. A template's ``raise_exception`` raises ``jinja2.TemplateError``."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        return _compile(self.chat_template).render(
            **(template_kwargs or {}), messages=[dict(m) for m in messages], tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **self.special_tokens_map)


def _content(token: str | dict) -> str:
    """A token as tokenizer_config.json writes it: a string, or a serialised AddedToken."""
    return token["content"] if isinstance(token, dict) else token


def _named_special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """bos_token, eos_token, unk_token, pad_token, ... and model-specific ones (image_token): every ``*_token``."""
    return {key: _content(value) for key, value in config.items()
            if key.endswith("_token") and isinstance(value, (str, dict))}


class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (transformers' assistant-mask tag) renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` without underscore attributes, as transformers hardens it (no way to CPython internals)."""

    def __init__(*args, **kwargs):  # Jinja's own signature trick, so namespace(self=...) still works
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")


class _Dict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without handing them the type itself."""

    __call__ = staticmethod(dict)
    fromkeys = staticmethod(dict.fromkeys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters (<, >, &, '), which chat templates must not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(chat_template: str) -> jinja2.Template:
    """The environment transformers renders chat templates in (templates are untrusted code: sandboxed)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=_Dict(), namespace=_Namespace)
    return env.from_string(chat_template)
