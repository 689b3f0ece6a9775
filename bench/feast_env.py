"""Feast's own virtual environment, so its pins never touch Bulldozer's.

Made on first use under ``~/.cache/bulldozer/feast-<version>`` (or
``$BULLDOZER_FEAST_VENV``) with ``pip install 'feast[redis]==<version>.*'`` from PyPI, at the
releases bench/feast-constraints.txt pins (scripts/gen_constraints.py), and reused
afterwards; a marker file naming the pins is written only after a complete install, so an
interrupted one, or one of other pins, is redone."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

FEAST_VERSION = "0.67"
FEAST_REQUIREMENT = f"feast[redis]=={FEAST_VERSION}.*"
FEAST_CONSTRAINTS = Path(__file__).resolve().parent / "feast-constraints.txt"
WORKER = Path(__file__).resolve().parent / "feast_worker.py"


def feast_venv() -> Path:
    default = Path.home() / ".cache" / "bulldozer" / f"feast-{FEAST_VERSION}"
    return Path(os.environ.get("BULLDOZER_FEAST_VENV", default))


def feast_python(log: bool = True) -> Path:
    """The Python of Feast's virtual environment, installing it when missing."""
    venv = feast_venv()
    python = venv / "bin" / "python"
    marker = venv / ".bulldozer-complete"
    made = f"{FEAST_VERSION} {hashlib.sha256(FEAST_CONSTRAINTS.read_bytes()).hexdigest()[:16]}\n"
    if python.exists() and marker.exists() and marker.read_text() == made:
        return python
    if log:
        print(f"installing {FEAST_REQUIREMENT} into {venv} (once, about a minute) ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--constraint",
            str(FEAST_CONSTRAINTS),
            FEAST_REQUIREMENT,
        ],
        check=True,
    )
    marker.write_text(made)
    return python


def feast_version(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('feast'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
