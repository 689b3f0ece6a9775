"""The executors' Python environment: ``bulldozer spark package``.

A Spark cluster runs Bulldozer's code in Python workers on the executors, which need the
same Bulldozer and its dependencies as the driver. ``build_archive`` packs them into one
archive for ``spark.archives`` (Spark unpacks it in each executor's working directory):
a virtual environment — ``pyvenv.cfg``, ``bin/python`` pointing at this interpreter's
base Python, and ``lib/pythonX.Y/site-packages`` with Bulldozer and the closure of its
runtime requirements (the installed files, as their ``RECORD`` lists them) — the layout
``venv-pack`` makes, built from what is installed here instead of a network install.
pyspark itself is not packed: Spark gives its Python workers its own ``pyspark.zip``.

The executors need the same Python (version and path) as this machine's base
interpreter, as with ``venv-pack``; the archive names it in ``pyvenv.cfg``.

``BULLDOZER_SPARK_ARCHIVE`` makes every Spark run ship the archive (``archive_conf``).
"""

from __future__ import annotations

import importlib.metadata as md
import io
import os
import re
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from bulldozer.errors import InvalidArgumentError

__all__ = ["ARCHIVE_DIR", "Packed", "archive_conf", "build_archive", "distributions"]

#: the folder the archive is unpacked as in each executor's working directory
ARCHIVE_DIR = "bulldozer_env"
#: what executors need beyond Bulldozer's own requirements (pyspark's Arrow paths import pandas)
EXECUTOR_EXTRAS = ("pandas",)
#: Bulldozer's own top-level packages (an editable install has no RECORD of them)
OWN_PACKAGES = ("bulldozer", "pyspark_bulldozer")


@dataclass
class Packed:
    path: Path
    distributions: list[str]
    files: int
    bytes: int
    seconds: float


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(roots: tuple[str, ...] = ("bulldozer", *EXECUTOR_EXTRAS)) -> list[md.Distribution]:
    """The installed distributions ``roots`` need at run time (requirements with their
    extras and markers evaluated), ``roots`` included."""
    from packaging.requirements import Requirement

    found: dict[str, tuple[md.Distribution, frozenset[str]]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in roots]
    while todo:
        name, extras = todo.pop()
        key = _key(name)
        if key in found and extras <= found[key][1]:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise InvalidArgumentError(f"{name} is required on the executors but is not installed here") from None
        extras = extras | (found[key][1] if key in found else frozenset())
        found[key] = (dist, extras)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return [found[k][0] for k in sorted(found)]


def _skipped(relative: str) -> bool:
    return "__pycache__" in relative or relative.endswith(".pyc")


def build_archive(output: Path, compress: bool = True) -> Packed:
    """Write the executors' environment to ``output`` (``.tar.gz``, or ``.tar`` when not
    ``compress``); returns what went in."""
    started = time.monotonic()
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    base = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    names: list[str] = []
    files = size = 0
    with tarfile.open(partial, "w:gz", compresslevel=1) if compress else tarfile.open(partial, "w") as tar:

        def add_text(name: str, text: str) -> None:
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))

        add_text(
            "pyvenv.cfg",
            f"home = {base.parent}\ninclude-system-site-packages = false\n"
            f"version = {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}\n",
        )
        link = tarfile.TarInfo("bin/python")
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, str(base), 0o755
        tar.addfile(link)
        for dist in distributions():
            name = dist.metadata["Name"]
            names.append(f"{name}=={dist.version}")
            if _key(name) == "bulldozer":
                continue  # its own files below (an editable install lists none)
            root = Path(str(dist.locate_file("")))
            for item in dist.files or []:
                relative = str(item)
                if relative.startswith("..") or _skipped(relative):
                    continue  # scripts outside site-packages; bytecode is rebuilt
                path = root / relative
                if path.is_file():
                    tar.add(path, f"{site}/{relative}", recursive=False)
                    files, size = files + 1, size + path.stat().st_size
        for package in OWN_PACKAGES:
            module = __import__(package)
            folder = Path(module.__file__ or "").parent
            for path in sorted(folder.rglob("*")):
                relative = path.relative_to(folder.parent).as_posix()
                if path.is_file() and not _skipped(relative):
                    tar.add(path, f"{site}/{relative}", recursive=False)
                    files, size = files + 1, size + path.stat().st_size
    partial.replace(output)
    return Packed(output, names, files, size, time.monotonic() - started)


def archive_conf(archive: Path | None = None) -> dict[str, str]:
    """The Spark properties that ship the executors' environment (``archive``, default
    ``BULLDOZER_SPARK_ARCHIVE``) and run their Python workers from it; empty without one."""
    if archive is None:
        from bulldozer.settings import load_settings

        archive = load_settings().spark_archive
    if archive is None:
        return {}
    if not archive.is_file():
        raise InvalidArgumentError(f"the Spark environment archive {archive} does not exist (bulldozer spark package)")
    python = f"./{ARCHIVE_DIR}/bin/python"
    return {
        "spark.archives": f"{archive.resolve().as_uri()}#{ARCHIVE_DIR}",
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.pyspark.python": python,
    }
