"""The executors' Python environment: ``bulldozer spark package``.

A Spark cluster runs Bulldozer's code in Python workers on the executors, which need the
same Bulldozer and its dependencies as the driver. ``build_archive`` packs them into one
archive for ``spark.archives`` (Spark unpacks it in each executor's working directory):
``lib/pythonX.Y/site-packages`` with Bulldozer and the closure of its runtime
requirements (the installed files, as their ``RECORD`` lists them, built from what is
installed here instead of a network install), and ``bin/python``, a script that runs this
machine's base interpreter with that folder first on its path (a virtual environment's
``bin/python`` is a symlink leaving the archive, which Spark refuses to unpack). A zip,
not a tar: Spark keeps the file modes of a zip's entries only.
pyspark itself is not packed: Spark gives its Python workers its own ``pyspark.zip``.

The executors need the same Python (version and path) as this machine's base
interpreter, as with ``venv-pack``; ``bin/python`` names it.

``BULLDOZER_SPARK_ARCHIVE`` makes every Spark run ship the archive (``archive_conf``).

How a run ships it (``session``): not as an archive Spark unpacks, but as a file beside a
small one, ``launcher_archive``'s. Spark unpacks every archive a context adds on the driver
too, with Java's zip reader: for this one (390 MB, 7,900 files) 12.9 s of the driver's
start on the 2-core machine, though the driver never runs it (its Python workers run its
own environment). A file is only copied there (1.8 s). The launcher is the executors'
``bin/python``: the first start on a node unpacks the file (Python's zipfile: 2 s here)
into the worker user's cache, where every later application's executors find it, and
every start runs the interpreter on it (``launcher_archive``). Measured on the loopback
cluster (2 M nested rows, 3 alternating runs each, the whole command): 29.1 s -> 19.5 s
median; 12.1 s with Bulldozer installed on the worker and nothing shipped. An archive
packed before it carried its ``MANIFEST`` ships whole, as before. Its own ``bin/python``
stays, so the archive still works as a plain ``spark.archives`` too.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import importlib.util
import json
import marshal
import os
import re
import shlex
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bulldozer import scratch
from bulldozer.errors import InvalidArgumentError
from bulldozer.load.engines.spark import node_cache
from bulldozer.settings import python_command

__all__ = [
    "ARCHIVE_DIR",
    "EXECUTOR_PYTHON",
    "MANIFEST",
    "Packed",
    "archive_conf",
    "build_archive",
    "distributions",
    "launcher_archive",
]

#: the folder the archive is unpacked as in each executor's working directory
ARCHIVE_DIR = "bulldozer_env"
#: the Python workers' interpreter with a shipped environment (relative to the working
#: directory: the executor's, and on the driver its JVM's — ``session._in_driver_folder``)
EXECUTOR_PYTHON = f"./{ARCHIVE_DIR}/bin/python"
#: the archive's entry saying what its launcher needs: the base interpreter and the folder of
#: its site-packages (JSON)
MANIFEST = "bulldozer-env.json"
#: the folder the launcher unpacks the environment to, in its own (``ARCHIVE_DIR``)
UNPACKED_DIR = "env"
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


#: the flags of an unchecked hash-based pyc (PEP 552): its source is never compared
_UNCHECKED_HASH = (0b01).to_bytes(4, "little")


def bytecode(path: Path) -> bytes | None:
    """``path``'s bytecode as an unchecked hash-based pyc (PEP 552), for the archive: the
    executors' Python worker daemon imports the modules it preloads without compiling them
    (Spark's unpacking does not keep file times, so timestamp-checked bytecode would be
    recompiled there by every executor). Only those modules: bytecode for every module
    grew the archive by a quarter, which its copy and unpacking on the driver and on each
    executor cost back. Taken from this interpreter's own cache when that is current, else
    compiled; None for a file that does not compile (a template, a test of another Python)."""
    source = path.read_bytes()
    header = importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH + importlib.util.source_hash(source)
    try:
        cached = Path(importlib.util.cache_from_source(str(path))).read_bytes()
        stat = path.stat()
        current = (
            cached[:8] == importlib.util.MAGIC_NUMBER + bytes(4)  # timestamp-based
            and int.from_bytes(cached[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(cached[12:16], "little") == stat.st_size & 0xFFFFFFFF
        )
        if current:
            return header + cached[16:]
    except OSError:
        pass
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return header + marshal.dumps(code)


def build_archive(output: Path, compress: bool = True) -> Packed:
    """Write the executors' environment to ``output``, a zip (deflated, or stored when not
    ``compress``: Spark keeps a zip's file modes, not a tar's); returns what went in."""
    started = time.monotonic()
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    base = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    partial = scratch.partial_path(output)
    names: list[str] = []
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        scratch.sweep_partials(output.parent, f"{output.name}.*.partial")
        files, size = _write_archive(partial, compress, site, base, names)
        partial.replace(output)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise InvalidArgumentError(f"cannot write the archive {output}: {exc.strerror or exc}") from None
    return Packed(output, names, files, size, time.monotonic() - started)


def preloaded_sources() -> set[str]:
    """The source files of the modules the executors' Python worker daemon imports
    (``daemon``), as a fresh interpreter imports them: the archive carries their bytecode."""
    import subprocess

    listing = (
        "import json, sys, bulldozer.load.engines.spark.daemon; "
        "print(json.dumps([getattr(m, '__file__', None) for m in list(sys.modules.values())]))"
    )
    done = subprocess.run(python_command("-c", listing), capture_output=True, text=True, check=True)
    return {str(Path(f)) for f in json.loads(done.stdout) if f and f.endswith(".py")}


def _write_entry(archive: zipfile.ZipFile, name: str, data: bytes | str, mode: int, method: int) -> None:
    """``data`` as the file ``name`` of ``archive`` with the unix ``mode`` (Spark's unpacking
    and the launcher's keep it: ``bin/python`` runs)."""
    info = zipfile.ZipInfo(name, time.localtime()[:6])
    info.create_system = 3  # unix
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = method
    archive.writestr(info, data)


def _write_archive(partial: Path, compress: bool, site: str, base: Path, names: list[str]) -> tuple[int, int]:
    files = size = 0
    preloaded = preloaded_sources()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(partial, "w", method, compresslevel=1 if compress else None) as archive:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            _write_entry(archive, name, data, mode, method)

        # bin/python runs this machine's base interpreter on the packed site-packages: a
        # script, not a venv's symlink (Spark's unpacking refuses links that leave the folder)
        add(
            "bin/python",
            (
                "#!/bin/sh\n"
                'here=$(cd "$(dirname "$0")/.." && pwd)\n'
                f'PYTHONPATH="$here/{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {shlex.quote(str(base))} -s "$@"\n'
            ).encode(),
            0o755,
        )

        def add_file(path: Path, name: str) -> None:
            nonlocal files, size
            mode = path.stat().st_mode & 0o777
            archive.write(path, name)
            archive.getinfo(name).external_attr = (0o100000 | mode) << 16
            files, size = files + 1, size + path.stat().st_size
            if name.endswith(".py") and str(path) in preloaded:
                compiled = bytecode(path)
                if compiled is not None:
                    add(importlib.util.cache_from_source(name), compiled)

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
                    add_file(path, f"{site}/{relative}")
        for package in OWN_PACKAGES:
            module = __import__(package)
            folder = Path(module.__file__ or "").parent
            for path in sorted(folder.rglob("*")):
                relative = path.relative_to(folder.parent).as_posix()
                if path.is_file() and not _skipped(relative):
                    add_file(path, f"{site}/{relative}")
        # last: its id names the entries above by their content (names, CRC-32s, sizes), so
        # an archive packed again from the same files has the same id (a node's cache of it)
        content = hashlib.sha256()
        for info in archive.infolist():
            content.update(f"{info.filename}\0{info.CRC}\0{info.file_size}\n".encode())
        add(MANIFEST, json.dumps({"python": str(base), "site": site, "id": content.hexdigest()[:32]}).encode())
    return files, size


def archive_conf(archive: Path | None = None) -> dict[str, str]:
    """The Spark properties that ship the executors' environment (``archive``, default
    ``BULLDOZER_SPARK_ARCHIVE``), unpacked as ``bulldozer_env`` in each executor's working
    directory; empty without one. ``spark_session`` then runs the Python workers as
    ``EXECUTOR_PYTHON``."""
    if archive is None:
        from bulldozer.settings import load_settings

        archive = load_settings().spark_archive
    if archive is None:
        return {}
    if not archive.is_file():
        raise InvalidArgumentError(f"the Spark environment archive {archive} does not exist (bulldozer spark package)")
    return {
        "spark.archives": f"{archive.resolve().as_uri()}#{ARCHIVE_DIR}",
    }


#: environments a node's cache keeps at least (each ~410 MB unpacked)
_KEEP = 3


def launcher_archive(environment: Path, folder: Path) -> Path | None:
    """A zip in ``folder`` holding the executors' ``bin/python`` for ``environment`` (an
    archive ``build_archive`` wrote), which is shipped beside it as a file of the same name.
    Unpacked as ``ARCHIVE_DIR`` in an executor's working directory, it runs the base
    interpreter on the environment unpacked once per node and user: in
    ``$XDG_CACHE_HOME/bulldozer/spark-env/ID`` (default ``~/.cache``), ID the archive's
    content, when that folder is the user's own and no one else's to write in; else once
    per application, in ``ARCHIVE_DIR/UNPACKED_DIR`` (an executor without a home). None for
    an archive without ``MANIFEST`` (packed by an earlier Bulldozer): it ships whole."""
    try:
        with zipfile.ZipFile(environment) as packed:
            manifest = json.loads(packed.read(MANIFEST))
    except KeyError:
        return None
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise InvalidArgumentError(f"the Spark environment archive {environment} cannot be read: {exc}") from None
    python, site, ident = shlex.quote(str(manifest["python"])), str(manifest["site"]), str(manifest["id"])
    # both go into the launcher's script as they are
    if not re.fullmatch(r"[0-9a-f]{32}", ident) or not re.fullmatch(r"lib/python\d+\.\d+/site-packages", site):
        raise InvalidArgumentError(
            f"the Spark environment archive {environment} has no valid id or folder in {MANIFEST}"
        )
    source = shlex.quote(environment.name)
    launcher = f"""\
#!/bin/sh
# Bulldozer's executors' Python (bulldozer.load.engines.spark.package.launcher_archive):
# runs the interpreter on the environment shipped beside this folder, unpacked once
here=$(cd "$(dirname "$0")/.." && pwd)
env="$here/{UNPACKED_DIR}" keep=0
cache="${{XDG_CACHE_HOME:-${{HOME:+$HOME/.cache}}}}"
if [ -n "$cache" ] && mkdir -p "$cache/bulldozer/spark-env" 2>/dev/null; then
  chmod 700 "$cache/bulldozer/spark-env" 2>/dev/null
  # the user's own folder, which no one else can write in: else its content is not trusted
  if [ "$(stat -c %u:%a "$cache/bulldozer/spark-env" 2>/dev/null)" = "$(id -u):700" ]; then
    env="$cache/bulldozer/spark-env/{ident}" keep={_KEEP}
  fi
fi
if [ -d "$env" ]; then
  touch "$env" 2>/dev/null
else
  {python} -s -I "$here/bin/unpack.py" "$here/../"{source} "$env" $keep || exit 1
fi
PYTHONPATH="$env/{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {python} -s "$@"
"""
    output = folder / "bulldozer-launcher.zip"
    with zipfile.ZipFile(output, "w") as archive:
        _write_entry(archive, "bin/python", launcher, 0o755, zipfile.ZIP_STORED)
        _write_entry(archive, "bin/unpack.py", Path(node_cache.__file__).read_text(), 0o644, zipfile.ZIP_STORED)
    return output
