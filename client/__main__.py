"""``python -m client generate PROMPT [...]``, ``python -m client chat [QUESTION]`` and ``python -m client health``.

``generate -n 3`` prints each sequence (with ``--json``: one JSON object per line, with its ``index``);
``--logprobs`` / ``--top-logprobs K`` add each token's log-prob to ``--json`` output (and a table on stderr without
it); ``--json-schema FILE``, ``--json-object``, ``--regex``, ``--grammar FILE`` constrain the output.

``chat QUESTION`` asks one question and streams the answer; ``chat`` alone reads one user turn per line from stdin
and keeps the conversation's history (an interactive chat, or a script piped in). Failures (server errors,
unreachable server, bad arguments) end with one line on stderr and exit code 1; a closed stdout (``| head``) ends
the request and exits 141, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys

from pathlib import Path

from client.core import Completion, GenerationError, Guide, SamplingParams, ServerUnavailableError, TokenLogprob
from client.sync import LLMClient


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default="localhost:8001", help="Triton gRPC endpoint (default: %(default)s)")
    common.add_argument("--model", default="ensemble", help="model name (default: %(default)s)")

    parser = argparse.ArgumentParser(prog="python -m client", description="Talk to the Triton LLM ensemble.")
    commands = parser.add_subparsers(dest="command", required=True)

    sampling = argparse.ArgumentParser(add_help=False)
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--seed", type=int)
    sampling.add_argument("--stop", action="append", default=[], metavar="S", help="stop string (repeatable)")
    sampling.add_argument("--repetition-penalty", type=float, metavar="P",
                          help="> 0; 1 is off, > 1 discourages tokens already seen (TensorRT-LLM's definition)")
    sampling.add_argument("--presence-penalty", type=float, metavar="P",
                          help="subtracted once from the logit of every token already seen")
    sampling.add_argument("--frequency-penalty", type=float, metavar="P",
                          help="subtracted from a seen token's logit once per occurrence")
    sampling.add_argument("--min-p", type=float, metavar="P",
                          help="0..1: drop tokens less likely than P × the most likely one")
    guide = sampling.add_mutually_exclusive_group()
    guide.add_argument("--json-schema", type=Path, metavar="FILE", help="the output must match this JSON Schema")
    guide.add_argument("--json-object", action="store_true", help="the output must be JSON")
    guide.add_argument("--regex", metavar="RE", help="the output must match this regular expression")
    guide.add_argument("--grammar", type=Path, metavar="FILE", help="the output must match this EBNF grammar "
                                                                     "(xgrammar's dialect, start rule 'root')")

    generate = commands.add_parser("generate", parents=[common, sampling], help="generate text for a prompt")
    generate.add_argument("prompt")
    generate.add_argument("--max-tokens", type=int, default=64, help="default: %(default)s")
    generate.add_argument("--stream", action="store_true",
                          help="print text as it arrives; TTFT and tokens/s go to stderr")
    generate.add_argument("--no-exclude-input", dest="exclude_input", action="store_false",
                          help="echo the prompt in the output")
    generate.add_argument("--json", action="store_true",
                          help="print one JSON object per sequence (with --stream: timings from the streamed request)")
    generate.add_argument("-n", type=int, metavar="N", help="how many sequences to generate (1..8)")
    generate.add_argument("--logprobs", action="store_true", help="each generated token's log-probability")
    generate.add_argument("--top-logprobs", type=int, metavar="K",
                          help="also the K most likely alternatives per token (0..20; implies --logprobs)")

    chat = commands.add_parser("chat", parents=[common, sampling],
                               help="ask one question (streamed), or chat with one turn per stdin line")
    chat.add_argument("question", nargs="?",
                      help="one user turn; without it, read turns from stdin (EOF or Ctrl-D ends the chat)")
    chat.add_argument("--system", help="a system message to start the conversation with")
    chat.add_argument("--max-tokens", type=int, default=256, help="per answer (default: %(default)s)")
    chat.add_argument("--stats", action="store_true", help="TTFT, tokens/s and finish reason on stderr per answer")

    commands.add_parser("health", parents=[common], help="server liveness/readiness and model readiness")
    # The top-level help names every request flag too (each command's --help explains them).
    parser.epilog = (f"generate and chat take {_flags(sampling)}; generate also {_flags(generate, skip=chat)}. "
                     "'python -m client generate --help' explains each.")
    return parser


def _flags(parser: argparse.ArgumentParser, skip: argparse.ArgumentParser | None = None) -> str:
    skipped = {flag for action in (skip._actions if skip else ()) for flag in action.option_strings}
    return ", ".join(action.option_strings[0] + (f" {action.metavar}" if action.metavar else "")
                     for action in parser._actions
                     if action.option_strings and action.option_strings[0] not in skipped | {"-h", "--url", "--model"})


def guide(args: argparse.Namespace) -> Guide | None:
    """The structured-output flag given, if any (they exclude each other); files are read here."""
    try:
        if args.json_schema is not None:
            return Guide("json_schema", args.json_schema.read_text(encoding="utf-8"))
        if args.grammar is not None:
            return Guide("ebnf_grammar", args.grammar.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
    if args.regex is not None:
        return Guide("regex", args.regex)
    return Guide("json") if args.json_object else None


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop=list(args.stop),
                          exclude_input_in_output=getattr(args, "exclude_input", True),
                          repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty, min_p=args.min_p, n=getattr(args, "n", None),
                          logprobs=getattr(args, "logprobs", False) or None,
                          top_logprobs=getattr(args, "top_logprobs", None), guide=guide(args))


def summary(completion: Completion) -> str:
    """One line: TTFT (the whole answer's time when it came as one chunk, as non-streamed answers and, under
    load, short streamed ones do: the server sends tokens that are ready together in one response), and the
    decode rate when there were several chunks."""
    t = completion.timings
    parts = [f"TTFT {t.ttft_s * 1e3:.1f} ms" + (" (one chunk)" if t.tpot_s is None else "")]
    parts.append(f"{t.output_tokens} tokens in {t.total_s:.3f} s")
    if t.decode_tokens_per_s is not None:
        parts.append(f"decode {t.decode_tokens_per_s:.1f} tok/s")
    if t.tokens_per_s is not None:
        parts.append(f"overall {t.tokens_per_s:.1f} tok/s")
    parts.append(f"finish: {completion.finish_reason}")
    return " | ".join(parts)


def _finite(logprob: float) -> float | None:
    """JSON has no -Infinity (a token the sampler could not pick): null."""
    return logprob if math.isfinite(logprob) else None


def _token_json(token: TokenLogprob) -> dict:
    return {"token": token.token, "bytes": list(token.bytes), "logprob": _finite(token.logprob),
            "top_logprobs": [{"token": t.token, "bytes": list(t.bytes), "logprob": _finite(t.logprob)}
                             for t in token.top]}


def completion_json(completion: Completion) -> dict:
    t = completion.timings
    data = {
        "index": completion.index,
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "num_input_tokens": completion.num_input_tokens,
        "num_output_tokens": completion.num_output_tokens,
        "request_id": completion.request_id,
        "timings": {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s, "total_s": t.total_s,
                    "decode_tokens_per_s": t.decode_tokens_per_s, "tokens_per_s": t.tokens_per_s},
    }
    if completion.logprobs is not None:
        data["logprobs"] = [_token_json(token) for token in completion.logprobs]
        data["cum_log_prob"] = completion.cum_log_prob
    return data


def logprob_table(completion: Completion) -> str:
    """One line per token: its log-prob, the token, then the alternatives."""
    lines = []
    for token in completion.logprobs or ():
        alternatives = "  ".join(f"{t.token!r} {t.logprob:.3f}" for t in token.top)
        lines.append(f"{token.logprob:9.4f}  {token.token!r}" + (f"  | {alternatives}" if alternatives else ""))
    return "\n".join(lines)


def _generate(llm: LLMClient, args: argparse.Namespace) -> int:
    params = sampling_params(args)
    if args.stream and params.sequences > 1:
        raise ValueError("--stream prints one sequence as it arrives: drop --stream, or -n")
    if args.stream:
        with llm.stream(args.prompt, params) as stream:
            for delta in stream:
                if not args.json:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            completions = stream.completions
        assert completions is not None  # the stream was exhausted, so the final response arrived
    else:
        completions = llm.generate_n(args.prompt, params)
    for completion in completions:
        if args.json:
            print(json.dumps(completion_json(completion), ensure_ascii=False))
            continue
        if len(completions) > 1:
            print(f"--- sequence {completion.index}")
        print("" if args.stream else completion.text)  # streamed text is already out: end its line
        if completion.logprobs is not None:
            print(logprob_table(completion), file=sys.stderr)
        print(summary(completion), file=sys.stderr)
    return 0


def _answer(llm: LLMClient, messages: list[dict[str, str]], args: argparse.Namespace) -> Completion:
    """Stream the assistant's next turn to stdout; end its line."""
    with llm.stream_chat(messages, sampling_params(args)) as stream:
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
        completion = stream.completion
    assert completion is not None  # the stream was exhausted, so the final response arrived
    print()
    if args.stats:
        print(summary(completion), file=sys.stderr)
    return completion


def _chat(llm: LLMClient, args: argparse.Namespace) -> int:
    history = [{"role": "system", "content": args.system}] if args.system else []
    if args.question is not None:
        _answer(llm, history + [{"role": "user", "content": args.question}], args)
        return 0
    interactive = sys.stdin.isatty()
    failed = False
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:  # EOF
            if interactive:
                print(file=sys.stderr)
            return 1 if failed else 0
        question = line.rstrip("\n")
        if not question.strip():
            continue
        turn = history + [{"role": "user", "content": question}]
        try:
            completion = _answer(llm, turn, args)
        except GenerationError as exc:  # e.g. the conversation outgrew the engine: say so, keep chatting
            if isinstance(exc, ServerUnavailableError):
                raise
            print("error: " + " ".join(str(exc).split()), file=sys.stderr)
            failed = True
            continue
        history = turn + [{"role": "assistant", "content": completion.text}]


def _health(llm: LLMClient) -> int:
    health = llm.health()
    for label, ok in (("server live", health.live), ("server ready", health.ready),
                      (f"model {llm.model} ready", health.model_ready)):
        print(f"{label}: {'yes' if ok else 'no'}")
    return 0 if health.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with LLMClient(args.url, args.model) as llm:
            commands = {"generate": _generate, "chat": _chat, "health": lambda llm, args: _health(llm)}
            return commands[args.command](llm, args)
    except (GenerationError, ValueError) as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the server sent
        return 1
    except KeyboardInterrupt:  # leaving the stream's with-block already cancelled the request
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader left (`| head`): the request is already cancelled; end as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush has nowhere to fail
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
