"""The executors' launcher for a shipped environment (``package.launcher_archive``), run as
Spark runs it: its zip unpacked as ``bulldozer_env`` in a working directory, the
environment beside it as a file, started with a clean environment. The environment here is
a small one in the archive's layout (a module in its site-packages, the manifest last), so
each start unpacks in milliseconds; ``tests/integration/test_spark_cluster.py`` runs the
real one on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bulldozer.errors import InvalidArgumentError
from bulldozer.load.engines.spark.package import ARCHIVE_DIR, MANIFEST, launcher_archive

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
IDENT = "0123456789abcdef0123456789abcdef"
BASE = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _environment(path: Path, ident: str = IDENT, manifest: bool = True, site: str = SITE) -> Path:
    with zipfile.ZipFile(path, "w") as packed:
        packed.writestr(f"{SITE}/shipped_probe.py", "WHERE = __file__\n")
        if manifest:
            packed.writestr(MANIFEST, json.dumps({"python": BASE, "site": site, "id": ident}))
    return path


def _executor(tmp_path: Path, ident: str = IDENT) -> Path:
    """An executor's working directory: the environment as a file, the launcher unpacked."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    environment = _environment(work / "bulldozer-env.zip", ident)
    launcher = launcher_archive(environment, tmp_path)
    assert launcher is not None
    with zipfile.ZipFile(launcher) as packed:
        for info in packed.infolist():
            os.chmod(packed.extract(info, work / ARCHIVE_DIR), (info.external_attr >> 16) & 0o777)
    return work


def _start(work: Path, home: Path | None) -> str:
    """Where ``bulldozer_env/bin/python`` imported the shipped module from, started as an
    executor starts it (a clean environment, from its working directory)."""
    env = {"PATH": "/usr/bin:/bin", **({"HOME": str(home)} if home is not None else {})}
    done = subprocess.run(
        [f"./{ARCHIVE_DIR}/bin/python", "-c", "import shipped_probe; print(shipped_probe.WHERE)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_environment_is_unpacked_once_per_node_into_the_user_s_cache(tmp_path: Path) -> None:
    work, home = _executor(tmp_path), tmp_path / "home"
    cache = home / ".cache" / "bulldozer" / "spark-env"
    # several starts at once on a cold node (an executor's worker daemons, two executors):
    # each runs the environment whole, and one folder of it is left
    with ThreadPoolExecutor(4) as pool:
        where = list(pool.map(lambda _: _start(work, home), range(4)))
    assert where == [str(cache / IDENT / SITE / "shipped_probe.py")] * 4
    assert sorted(os.listdir(cache)) == [IDENT]
    assert (cache.stat().st_mode & 0o777) == 0o700
    # a later application's start finds it: nothing unpacked again, the folder marked used
    os.utime(cache / IDENT, (0, 0))
    (cache / IDENT / SITE / "marker").write_text("kept")
    assert _start(_executor(tmp_path / "again"), home) == where[0]
    assert (cache / IDENT / SITE / "marker").read_text() == "kept"
    assert time.time() - (cache / IDENT).stat().st_mtime < 60


def test_without_a_home_each_application_unpacks_its_own(tmp_path: Path) -> None:
    work = _executor(tmp_path)
    assert _start(work, None) == str(work / ARCHIVE_DIR / "env" / SITE / "shipped_probe.py")


def test_a_cache_folder_not_the_user_s_own_alone_is_not_used(tmp_path: Path) -> None:
    """Its content could be anyone's: the start unpacks in the application's folder. A
    link in its place (to wherever it leads), and, where the suite may give a folder away
    (as root), a folder another user owns."""
    home = tmp_path / "home"
    cache = home / ".cache" / "bulldozer" / "spark-env"
    cache.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    cache.symlink_to(elsewhere)
    work = _executor(tmp_path / "linked")
    assert _start(work, home) == str(work / ARCHIVE_DIR / "env" / SITE / "shipped_probe.py")
    assert os.listdir(elsewhere) == []
    if os.geteuid() == 0:
        cache.unlink()
        cache.mkdir()
        os.chown(cache, 65534, 65534)
        work = _executor(tmp_path / "given")
        assert _start(work, home) == str(work / ARCHIVE_DIR / "env" / SITE / "shipped_probe.py")
        assert os.listdir(cache) == []


def test_a_new_environment_drops_old_ones_no_start_used_for_a_day(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cache = home / ".cache" / "bulldozer" / "spark-env"
    cache.mkdir(parents=True, mode=0o700)
    day = 86_400
    ages = {"a" * 32: 5 * day, "b" * 32: 4 * day, "c" * 32: 3 * day, "d" * 32: 60, "e" * 32: 2 * day}
    for ident, age in ages.items():
        (cache / ident).mkdir()
        os.utime(cache / ident, (time.time() - age, time.time() - age))
    (cache / ".unpacking-killed").mkdir()  # a start killed while unpacking, two hours ago
    os.utime(cache / ".unpacking-killed", (time.time() - 7200, time.time() - 7200))
    (cache / ".unpacking-now").mkdir()  # another start unpacking now
    (cache / ".removing-killed").mkdir()  # a start killed while it removed one, two hours ago
    os.utime(cache / ".removing-killed", (time.time() - 7200, time.time() - 7200))
    _start(_executor(tmp_path), home)
    # kept: the new one, the two used last (one of them a minute ago), and every one used
    # within a day however many; dropped: the others, and the killed start's leftovers
    assert sorted(os.listdir(cache)) == sorted([IDENT, "d" * 32, "e" * 32, ".unpacking-now"])


def test_an_archive_packed_before_the_manifest_ships_whole_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    assert launcher_archive(_environment(tmp_path / "old.zip", manifest=False), tmp_path) is None
    with pytest.raises(InvalidArgumentError, match="has no valid id or folder"):
        launcher_archive(_environment(tmp_path / "odd.zip", ident="../../etc"), tmp_path)
    with pytest.raises(InvalidArgumentError, match="has no valid id or folder"):
        launcher_archive(_environment(tmp_path / "odder.zip", site='x"$(touch /tmp/owned)"'), tmp_path)
    (tmp_path / "cut.zip").write_bytes(b"PK\x03\x04 not a whole zip")
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        launcher_archive(tmp_path / "cut.zip", tmp_path)
