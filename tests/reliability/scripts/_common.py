"""Argument handling shared by the long-running scripts: which repository to serve, where to write."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def parser(doc: str, name: str | None = None) -> argparse.ArgumentParser:
    """Common options; with ``name``, also --name and --replot for a script that writes <name>.json/.png."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", type=Path,
                    help="a rendered model repository to serve (default: the test suite's tiny stack)")
    ap.add_argument("--slots", type=int, default=None, help="KV slots of that repository's engine")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/reliability"))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability")
    if name is not None:
        ap.add_argument("--name", default=name, help="results go to <out>/<name>.json and <out>/<name>.png")
        ap.add_argument("--replot", action="store_true", help="only redraw <out>/<name>.png from <name>.json")
    return ap


def replot(args, plot: Callable[[dict, Path], None]) -> bool:
    """With --replot: redraw the PNG from the saved JSON and say so."""
    if args.replot:
        plot(json.loads((args.out / f"{args.name}.json").read_text()), args.out / f"{args.name}.png")
    return args.replot


def publish(args, data: dict, result: dict, plot: Callable[[dict, Path], None]) -> None:
    """Write <name>.json (``data``) and draw <name>.png from ``result``."""
    write_json(args.out / f"{args.name}.json", data)
    try:
        plot(result, args.out / f"{args.name}.png")
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)


def repository(args, limits: dict | None = None, llm_queue: int = 32) -> tuple[Path, int]:
    """(repository, slots): the given one, or the tiny random Llama rendered like tests/conftest.py's."""
    from tests.reliability import relkit  # its psutil: only where a server is started here

    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.repository is not None:
        if args.slots is None:
            raise SystemExit("--slots is required with --repository (the engine's max_batch_size)")
        return args.repository, args.slots
    checkpoint, engine = relkit.build_tiny_stack(args.workdir, limits)
    slots = dict(relkit.TEST_LIMITS, **(limits or {}))["max_batch_size"]
    tag = "-".join(f"{k}{v}" for k, v in sorted((limits or {}).items())) or "default"
    return relkit.render(args.workdir / f"repo-{tag}-q{llm_queue}", engine, checkpoint, llm_queue=llm_queue), slots


def on_server(args, repo: Path, load: Callable[[object], dict]) -> dict:
    """Start a server on ``repo``, run ``load(server)``, stop it (drain included): the exit code goes in the report."""
    from tests.reliability import relkit

    server = relkit.start_server(repo, args.workdir, name=args.name)
    try:
        result = load(server)
    finally:
        rc = server.stop()
    result["report"]["server_exit_code"] = rc
    return result


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
