"""Feast's own virtual environment, so its pins never touch Bulldozer's.

Made on first use under ``~/.cache/bulldozer/feast-<version>`` (or
``$BULLDOZER_FEAST_VENV``) with ``pip install 'feast[redis]==<version>.*'`` from PyPI, and
reused afterwards; a marker file is written only after a complete install, so an
interrupted one is redone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

FEAST_VERSION = "0.67"
WORKER = Path(__file__).resolve().parent / "feast_worker.py"


def feast_venv() -> Path:
    default = Path.home() / ".cache" / "bulldozer" / f"feast-{FEAST_VERSION}"
    return Path(os.environ.get("BULLDOZER_FEAST_VENV", default))


def feast_python(log: bool = True) -> Path:
    """The Python of Feast's virtual environment, installing it when missing."""
    venv = feast_venv()
    python = venv / "bin" / "python"
    marker = venv / ".bulldozer-complete"
    if marker.exists() and python.exists():
        return python
    if log:
        print(f"installing feast[redis]=={FEAST_VERSION}.* into {venv} (once, about a minute) ...", flush=True)
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
            f"feast[redis]=={FEAST_VERSION}.*",
        ],
        check=True,
    )
    marker.write_text(FEAST_VERSION + "\n")
    return python


def feast_version(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('feast'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
