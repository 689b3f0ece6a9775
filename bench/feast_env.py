"""Feast's own virtual environment, so its pins never touch Bulldozer's.

Made on first use under ``~/.cache/bulldozer/feast-<version>-<interpreter>`` (or
``$BULLDOZER_FEAST_VENV``) with ``pip install 'feast[redis]==<version>.*'`` from PyPI, at the
releases bench/feast-constraints.txt pins (scripts/gen_constraints.py), and reused
afterwards; a marker file naming the pins is written only after a complete install, so an
interrupted one, or one of other pins, is redone.

Feast runs on the interpreter Bulldozer's venv was made with (scripts/bootstrap.sh chooses
it): builds of one Python release differ in speed (pyenv's 3.11.7 took 1.15x the time of
Debian's 3.11.2 for a one-shot run here), so both sides of a comparison run on the same one.
Each interpreter has a venv of its own, and the marker names it too."""

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


def base_python() -> str:
    """The interpreter this process's venv was made with (its real path)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def feast_venv() -> Path:
    made_with = hashlib.sha256(base_python().encode()).hexdigest()[:8]
    default = Path.home() / ".cache" / "bulldozer" / f"feast-{FEAST_VERSION}-{made_with}"
    return Path(os.environ.get("BULLDOZER_FEAST_VENV", default))


def feast_python(log: bool = True) -> Path:
    """The Python of Feast's virtual environment, installing it when missing."""
    venv = feast_venv()
    python = venv / "bin" / "python"
    marker = venv / ".bulldozer-complete"
    pins = hashlib.sha256(FEAST_CONSTRAINTS.read_bytes()).hexdigest()[:16]
    made = f"{FEAST_VERSION} {pins} {base_python()}\n"
    if python.exists() and marker.exists() and marker.read_text() == made:
        return python
    if log:
        print(f"installing {FEAST_REQUIREMENT} into {venv} (once, about a minute) ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True)
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
