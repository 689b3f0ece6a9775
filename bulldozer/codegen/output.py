"""Where a generated client is written: a folder of its own.

A client replaces its own files when it is generated again, and Java's and Go's generated
source folders whole (no stale classes or packages). Pointed by mistake at a folder that
holds something else — a service's repository, a home folder — it would overwrite that
folder's ``README.md`` and ``pom.xml`` / ``pyproject.toml`` and delete its
``src/main/java``. So the first generation into a folder leaves a marker there
(``MARKER``: the job and language), and a folder is written into only when it is new,
empty, or marked for the same job and language.
"""

from __future__ import annotations

import json
from pathlib import Path

from bulldozer.errors import InvalidArgumentError

__all__ = ["MARKER", "claim_folder", "write_files"]

#: the file that marks a folder as one job's generated client in one language
MARKER = ".bulldozer-client.json"


def claim_folder(out: Path, job: str, lang: str) -> None:
    """Make ``out`` the ``lang`` client folder of ``job``, or raise InvalidArgumentError
    naming what it holds, before anything in it is replaced or deleted."""
    mark = {"job": job, "lang": lang}
    marker = out / MARKER
    if out.is_dir() and any(out.iterdir()):
        if not marker.is_file():
            names = sorted(p.name for p in out.iterdir())
            held = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
            raise InvalidArgumentError(
                f"--out {out} holds files `bulldozer client` did not write ({held}): a client replaces its "
                "folder's files and source folders, so write it into a new or empty folder"
            )
        try:
            found = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found = None
        if found != mark:
            said = f"the {found.get('lang')} client of {found.get('job')!r}" if isinstance(found, dict) else "a marker"
            raise InvalidArgumentError(
                f"--out {out} holds {said}, not the {lang} client of {job!r}: write it into another folder"
            )
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(mark) + "\n", encoding="utf-8")


def write_files(files: dict[Path, bytes]) -> list[Path]:
    """Write each file (its folders made); the paths, sorted."""
    for path, data in sorted(files.items()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)
