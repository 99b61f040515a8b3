"""Write a checkpoint directory all at once: built in a sibling temp dir, fixed permissions, renamed into place.

Readers never see a half-written checkpoint (a build cut short leaves the old one or none), the same build gives
the same bytes *and* modes (safetensors writes its file 0600; mkdtemp makes 0700), and a directory this project
did not write — no ``marker`` file in it — is never replaced.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(out_dir: Path, write: Callable[[Path], None], marker: str) -> Path:
    """Run ``write(tmp)``, then put ``tmp`` in place of ``out_dir`` (files 0644, directories 0755)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / marker).is_file():
        raise FileExistsError(f"{out_dir} exists and was not written by this builder (no {marker}); not replacing it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        new = work / "new"
        new.mkdir()
        write(new)
        for path in [new, *new.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out_dir.exists():  # moved aside first, deleted with the work dir
            out_dir.rename(work / "old")
        new.rename(out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out_dir
