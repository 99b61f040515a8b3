"""The server's part of requirements.lock, for the CPU image: the same pins and sha256 hashes, fewer packages.

requirements.lock is the whole development environment (tests, load tests, plots, Helm checks, the model
conversion). The image runs only the server: tritonserver's Python models (CPU engine, tokenizer) and the
OpenAI front door. This prints the lock's entries reachable from the project's runtime dependencies
(pyproject.toml ``[project].dependencies`` minus :data:`NOT_IN_IMAGE`), following the lock's own ``# via``
annotations, plus pip and setuptools (the editable install). Nothing is resolved: every line printed is a line
of the lock, so ``pip install --require-hashes --no-deps`` checks the same hashes.

    python3 scripts/image_requirements.py [requirements.lock] > image.lock

Standard library only (it runs inside the image build, before anything is installed).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Runtime dependencies the server never imports: load tests (locust, gevent), plots (matplotlib) and the default
#: model's conversion from GGUF (accelerate, gguf), which happens before the image is built.
NOT_IN_IMAGE = {"locust", "gevent", "matplotlib", "accelerate", "gguf"}
#: Installed besides the closure: pip (the lock's own) and setuptools (builds the editable install).
ALWAYS = {"pip", "setuptools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (the entry's requirement lines, the names in its ``# via``)."""
    entries: dict[str, tuple[list[str], set[str]]] = {}
    current: str | None = None
    in_via = False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            current = canonical(line.split("==", 1)[0].split("[", 1)[0].strip())
            entries[current] = ([line], set())
            in_via = False
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("--hash") or stripped.endswith("\\"):
            entries[current][0].append(line)
        elif stripped.startswith("# via"):
            rest = stripped[len("# via"):].strip()
            in_via = not rest
            if rest:
                entries[current][1].add(rest)
        elif in_via and stripped.startswith("#   "):
            entries[current][1].add(stripped[4:].strip())
        else:
            in_via = False
    return {name: ("\n".join(lines), {canonical(v.split()[0]) for v in via if not v.startswith("-r")})
            for name, (lines, via) in entries.items()}


def runtime_roots(pyproject: Path) -> set[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {canonical(re.split(r"[\[=<>!~; ]", d, maxsplit=1)[0]) for d in deps} - NOT_IN_IMAGE


def closure(lock: dict[str, tuple[str, set[str]]], roots: set[str]) -> set[str]:
    missing = roots - lock.keys()
    if missing:
        raise SystemExit(f"image_requirements: {sorted(missing)} not in the lock: run `make lock`")
    chosen = set(roots)
    while True:
        more = {name for name, (_, via) in lock.items() if name not in chosen and via & chosen}
        if not more:
            return chosen
        chosen |= more


def main(argv: list[str]) -> int:
    lock_path = Path(argv[1]) if len(argv) > 1 else ROOT / "requirements.lock"
    lock = parse_lock(lock_path.read_text())
    chosen = closure(lock, runtime_roots(lock_path.parent / "pyproject.toml")) | (ALWAYS & lock.keys())
    print(f"# {len(chosen)} of the {len(lock)} entries of {lock_path.name}: the server's runtime (scripts/image_requirements.py)")
    for name in sorted(chosen):
        print(lock[name][0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
