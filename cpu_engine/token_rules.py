"""What a request's rules do to its sequences' next token. Before sampling, masks on the logits: the embedding bias,
bad words, the grammar, and min_tokens' ban of end_id. After sampling, whether the token ends the sequence: end_id
or the grammar's end (the token is dropped), a stop word or the length (the token is kept).

Pure functions of the sequences and the logits: the engine loop (engine.py) frees slots and sends the events.
"""

from __future__ import annotations

import torch

from .scheduler import FinishReason, Sequence


def mask_logits(seqs: list[Sequence], logits: torch.Tensor) -> dict[int, Exception]:
    """Masks ``logits`` [B, V] in place: the embedding bias, bad words, the grammar, then min_tokens' ban of end_id,
    unless the grammar allows nothing else. Returns the rows whose grammar failed, with the exception: the caller
    ends them, dropping their token."""
    biased = [i for i, s in enumerate(seqs) if s.request.embedding_bias is not None]
    if biased:
        logits[biased] += torch.stack([seqs[i].request.embedding_bias for i in biased]).to(logits.dtype)
    rows, banned, failed = [], [], {}
    for i, seq in enumerate(seqs):
        for token in banned_tokens(seq):
            rows.append(i)
            banned.append(token)
    guided = [i for i, s in enumerate(seqs) if s.matcher is not None]
    if guided:
        from .grammar import apply_bitmask, new_bitmask  # only guided requests need it

        bitmask = new_bitmask(len(guided), logits.shape[-1])
        for j, i in enumerate(guided):
            try:
                seqs[i].matcher.fill(bitmask, j)
            except Exception as exc:  # noqa: BLE001 - one request's grammar must not fail the batch
                failed[i] = exc
        constrained = logits[guided]
        apply_bitmask(constrained, bitmask)
        logits[guided] = constrained
    for i, seq in enumerate(seqs):
        end = seq.request.end_id
        if end is None or len(seq.output_ids) >= seq.request.sampling.min_tokens:
            continue
        if seq.matcher is None or int(torch.isfinite(logits[i]).sum()) > int(torch.isfinite(logits[i, end])):
            rows.append(i)
            banned.append(end)
    if rows:
        logits[rows, banned] = float("-inf")
    return failed


def banned_tokens(seq: Sequence) -> list[int]:
    """Bad words whose prefix the sequence ends with (min_tokens' end_id ban is in mask_logits, below grammars)."""
    banned = []
    for word in seq.request.bad_words:
        prefix = word[:-1]
        if not prefix or tail(seq, len(prefix)) == prefix:
            banned.append(word[-1])
    return banned


def tail(seq: Sequence, n: int) -> list[int]:
    """The last ``n`` tokens of prompt + output, without copying the whole history."""
    out = seq.output_ids[-n:]
    if len(out) < n:
        out = seq.request.prompt_ids[len(seq.request.prompt_ids) - (n - len(out)):] + out
    return out


def accept(seq: Sequence, token: int, max_seq_len: int,
           token_bytes: list[bytes] | None) -> tuple[bool, FinishReason | None]:
    """Whether the sampled ``token`` joins the output, and the reason the sequence ends (None: it goes on).
    end_id and the grammar's end or refusal end it without the token (STOP); a stop word (STOP) or the length
    (LENGTH) end it with the token as its last."""
    req = seq.request
    ended = req.end_id is not None and token == req.end_id
    if seq.matcher is not None and not ended:
        # The grammar's own stop token ends it like end_id; a token it refuses cannot be continued either.
        ended = not seq.matcher.accept(token) or seq.matcher.finished()
    if ended:
        return False, FinishReason.STOP
    seq.output_ids.append(token)
    if hits_stop_word(seq, token, token_bytes):
        return True, FinishReason.STOP
    if len(seq.output_ids) >= req.max_new_tokens or seq.length >= max_seq_len:
        return True, FinishReason.LENGTH
    return True, None


def hits_stop_word(seq: Sequence, token: int, token_bytes: list[bytes] | None) -> bool:
    words = seq.request.stop_words
    if not words:
        return False
    if token_bytes is None:  # no tokenizer: token-level match only
        return any(seq.output_ids[-len(w):] == w for w in words)
    return seq.stops.hit(token_bytes[token])  # on text: stop_strings.py
