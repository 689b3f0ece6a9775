"""A loader's check that the code its commands would run is still what it imported
(``bulldozer.cli.loader.installed``): the kernel's watch and the scan it falls back to see
the same changes, and neither sees the bytecode caches the commands write."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bulldozer.cli.loader import installed as installed_module
from bulldozer.cli.loader.installed import CodeWatch, Installed, local_file_systems


@pytest.fixture
def installed(tmp_path: Path) -> Installed:
    """A package of two folders, a site-packages folder with one distribution, a binary."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("x = 1\n")
    library = tmp_path / "site-packages"
    (library / "dep-1.0.dist-info").mkdir(parents=True)
    (library / "dep").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kvd").write_bytes(b"\x7fELF old")
    return Installed(str(package), (str(library),), str(tmp_path / "bin" / "kvd"))


def _replace(path: Path, data: bytes) -> None:
    """As a build or pip replaces a file: written aside, renamed over it."""
    aside = path.with_name(path.name + ".new")
    aside.write_bytes(data)
    aside.replace(path)


def _make(folder: Path, file: str, data: bytes = b"") -> None:
    folder.mkdir()
    (folder / file).write_bytes(data)


def _append(path: Path) -> None:
    with path.open("a") as f:  # in place, as an editor saves
        f.write("y = 2\n")


CHANGES: dict[str, Callable[[Path], object]] = {
    "a module edited in place": lambda root: _append(root / "pkg" / "sub" / "mod.py"),
    "a module replaced": lambda root: _replace(root / "pkg" / "__init__.py", b"z = 3\n"),
    "a module added": lambda root: (root / "pkg" / "sub" / "new.py").write_text(""),
    "a module removed": lambda root: (root / "pkg" / "sub" / "mod.py").unlink(),
    "a module's time changed": lambda root: os.utime(root / "pkg" / "__init__.py", (1, 1)),
    "a subpackage added": lambda root: _make(root / "pkg" / "more", "__init__.py"),
    "the binary rebuilt": lambda root: _replace(root / "bin" / "kvd", b"\x7fELF new"),
    "a distribution upgraded": lambda root: (root / "site-packages" / "dep-1.0.dist-info").rename(
        root / "site-packages" / "dep-2.0.dist-info"
    ),
    "a distribution installed": lambda root: (root / "site-packages" / "new-0.1.dist-info").mkdir(),
}

NOT_CHANGES: dict[str, Callable[[Path], object]] = {
    "bytecode written": lambda root: _make(root / "pkg" / "sub" / "__pycache__", "mod.cpython-311.pyc", b"pyc"),
    "a file beside the binary": lambda root: (root / "bin" / "kvd-batchget").write_bytes(b"other"),
    "a distribution's files": lambda root: (root / "site-packages" / "dep" / "x.py").write_text(""),
    "a file read": lambda root: (root / "pkg" / "sub" / "mod.py").read_text(),
}


@pytest.mark.parametrize("kernel", [True, False], ids=["inotify", "scan"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_change_to_the_installed_code_is_seen(
    installed: Installed, tmp_path: Path, kernel: bool, change: str
) -> None:
    watch = CodeWatch(installed, use_inotify=kernel)
    try:
        assert watch.watched_by_kernel is (kernel and sys.platform == "linux")
        assert not watch.changed()
        CHANGES[change](tmp_path)
        assert watch.changed()
        assert watch.changed()  # and stays so
    finally:
        watch.close()


@pytest.mark.parametrize("kernel", [True, False], ids=["inotify", "scan"])
def test_what_a_command_writes_or_reads_is_no_change(installed: Installed, tmp_path: Path, kernel: bool) -> None:
    watch = CodeWatch(installed, use_inotify=kernel)
    try:
        for name, act in NOT_CHANGES.items():
            act(tmp_path)
            assert not watch.changed(), name
    finally:
        watch.close()


def test_the_watch_falls_back_to_scanning_where_the_kernel_cannot_watch(tmp_path: Path) -> None:
    """A folder it cannot watch (here: the binary's, not there) leaves it scanning."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("")
    watch = CodeWatch(Installed(str(package), (), str(tmp_path / "nowhere" / "kvd")))
    try:
        assert not watch.watched_by_kernel
        assert not watch.changed()
        _append(package / "m.py")
        assert watch.changed()
    finally:
        watch.close()


def test_this_installation_is_watched_by_the_kernel() -> None:
    """The loader's own check (``Installed.here``) takes the fast path on this machine."""
    if sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    watch = CodeWatch(Installed.here())
    try:
        assert watch.watched_by_kernel
        assert not watch.changed()
        assert any(name.endswith(".dist-info") for name in os.listdir(Installed.here().libraries[0]))
    finally:
        watch.close()


MOUNTS = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:40 / /srv/code rw,relatime shared:5 - nfs4 fileserver:/code rw,vers=4.2
31 27 0:41 / /mnt/my\\040disk rw - xfs /dev/vdb rw
32 27 0:42 / /home/u/fuse rw - fuse.sshfs u@host:/ rw
"""


@pytest.mark.parametrize(
    ("folder", "local"),
    [
        ("/opt/venv/lib/python3.11/site-packages", True),
        ("/srv/code/bulldozer", False),  # another machine may change it
        ("/srv/codes", True),  # beside the NFS mount, not under it
        ("/mnt/my disk/bulldozer", True),
        ("/home/u/fuse/bulldozer", False),
        ("/proc/self", False),
    ],
)
def test_the_kernel_watches_only_file_systems_no_other_machine_changes(folder: str, local: bool) -> None:
    assert local_file_systems([folder], MOUNTS) is local
    assert local_file_systems(["/opt", folder], MOUNTS) is local


def test_code_on_a_network_file_system_is_scanned(
    installed: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(installed_module, "local_file_systems", lambda folders: False)
    watch = CodeWatch(installed)
    try:
        assert not watch.watched_by_kernel
        assert not watch.changed()
        _append(tmp_path / "pkg" / "sub" / "mod.py")
        assert watch.changed()
    finally:
        watch.close()


@pytest.mark.parametrize("kernel", [True, False], ids=["inotify", "scan"])
@pytest.mark.parametrize("changed_first", [True, False], ids=["changed", "unchanged"])
def test_a_closed_watch_says_what_it_saw_until_closed(
    installed: Installed, tmp_path: Path, kernel: bool, changed_first: bool
) -> None:
    """A loader's child closes the watch it inherits: the watch then answers as it had, never
    "changed" for a change it did not see (nor forgets one it had)."""
    watch = CodeWatch(installed, use_inotify=kernel)
    if changed_first:
        _append(tmp_path / "pkg" / "sub" / "mod.py")
    watch.close()
    watch.close()  # again: nothing more
    assert watch.changed() is changed_first
    assert not watch.watched_by_kernel
