"""A request's guided-decoding guide, compiled for the model that serves it (the CPU llm, the tensorrt_llm stand-in)
or only checked (the GPU wrapper, before the backend compiles it): xgrammar loads on the first guided request."""

from __future__ import annotations

from pathlib import Path


class GuideCompiler:
    def __init__(self, tokenizer_dir: str | Path, vocab_size: int, error: type[Exception]):
        self.tokenizer_dir, self.vocab_size, self.error = tokenizer_dir, vocab_size, error
        self._grammars = None

    def __call__(self, guide_type: str, guide: str):
        """The compiled guide, or None without a guide type; a guide that cannot be compiled or enforced raises
        ``error`` with cpu_engine.grammar's message naming the problem."""
        if not guide_type:
            return None
        from cpu_engine.grammar import Grammars, GuideError  # xgrammar (and torch) only when a guide is asked for

        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer_dir, self.vocab_size)
        try:
            return self._grammars.compile(guide_type, guide)
        except GuideError as exc:
            raise self.error(str(exc)) from None
