"""Scratch folders (bulldozer.scratch): a killed process's are swept by the next one; a
live process's, a folder being made and anything not made by it are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from bulldozer import scratch

_MAKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from bulldozer import scratch
    path = scratch.make("dal", Path(sys.argv[1]))
    (path / "dal.sock").write_text("")
    print(path, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "fork":
        if os.fork() == 0:  # a forked child holds the folder on, as the loader's commands do
            time.sleep(60)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    """
)


def _maker(root: Path, how: str) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _MAKER, str(root), how], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_makers_folder_is_swept_and_a_live_ones_is_not(tmp_path: Path) -> None:
    killed, gone = _maker(tmp_path, "kill")
    killed.wait()
    assert gone.is_dir()  # SIGKILL ran no clean-up
    alive, kept = _maker(tmp_path, "live")
    forked, held = _maker(tmp_path, "fork")  # its maker is killed, its forked child lives
    forked.wait()
    being_made = tmp_path / "bulldozer-dal-beingmade"
    (being_made / ".owner.new").parent.mkdir()
    (being_made / ".owner.new").write_text("")
    other = tmp_path / "bulldozer-notes"
    other.mkdir()
    unrelated = tmp_path / "someone-else"
    unrelated.mkdir()
    try:
        mine = scratch.make("dal", tmp_path)
        assert not gone.exists()  # swept by the next maker
        assert kept.is_dir() and held.is_dir() and being_made.is_dir() and other.is_dir() and unrelated.is_dir()
        assert scratch.sweep(tmp_path) == []  # this process's own folder is locked too
        scratch.remove(mine)
        assert not mine.exists()
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        os.killpg(forked.pid, signal.SIGKILL)
        alive.wait()
    # once the forked child is gone too (the kernel frees its lock as it exits), both are abandoned
    deadline = time.monotonic() + 10
    while (kept.exists() or held.exists()) and time.monotonic() < deadline:
        scratch.sweep(tmp_path)
        time.sleep(0.05)
    assert not kept.exists() and not held.exists()


def test_a_folder_is_private_and_removed_on_exit(tmp_path: Path) -> None:
    with scratch.folder("protoc", tmp_path) as path:
        assert path.parent == tmp_path and path.name.startswith("bulldozer-protoc-")
        assert path.stat().st_mode & 0o777 == 0o700
        assert (path / scratch.OWNER).is_file()
    assert not path.exists()


def test_a_folder_for_sockets_is_made_where_their_paths_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the temporary directory while a socket's path there fits in sun_path; past that,
    in the first short place this user may write to; with none, one line saying so."""
    from bulldozer.errors import BackendUnavailableError
    from bulldozer.sockets import SOCKET_PATH_MAX

    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert scratch.socket_root("dal") is None
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert scratch.socket_root("dal") == Path("/tmp")
    with scratch.folder("dal", sockets=True) as made:
        assert made.parent == Path("/tmp") and made.name.startswith("bulldozer-dal-")
        assert len(str(made / "kvd-metrics.sock")) <= SOCKET_PATH_MAX
    assert not made.exists()
    with scratch.folder("protoc") as plain:  # a folder for files stays in the temporary directory
        assert plain.parent == deep
    monkeypatch.setattr(scratch, "SOCKET_ROOTS", (str(deep),))
    with pytest.raises(BackendUnavailableError, match="set TMPDIR to a shorter path"):
        scratch.socket_root("dal")
