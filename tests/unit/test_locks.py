"""``bulldozer.locks``: first-use work one process at a time, and the code generator's tools
fetched under it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bulldozer import locks


def test_a_fetch_waits_for_the_one_under_way_and_takes_what_it_fetched(tmp_path: Path) -> None:
    """Two ``bulldozer client --lang java`` starting together on a new machine both fetched
    protoc from Maven Central into the same file, and one could run it while the other still
    wrote it. Now the second waits for the first's lock and then takes its file: here the
    test holds the lock and finishes the "fetch" itself, and the waiting process fetches
    nothing (the fake protoc it returns is the test's)."""
    from bulldozer.codegen import native

    env = {**os.environ, "BULLDOZER_CACHE": str(tmp_path)}
    version = native._protobuf_java()
    tools = tmp_path / "tools"
    exe = tools / "protoc" / f"protoc-{version}-linux-x86_64.exe"
    with locks.held(tmp_path / "locks" / f"protoc-{version}.lock", "the test's fetch") as holding:
        assert holding
        waiting = subprocess.Popen(
            [sys.executable, "-c", "from bulldozer.codegen.native import java_protoc; print(java_protoc())"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        assert waiting.poll() is None, "it went on while another process was fetching"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\necho fake\n")
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and out.strip() == str(exe)
    assert exe.read_text() == "#!/bin/sh\necho fake\n"  # not fetched again


def test_the_lock_is_free_again_when_its_holder_is_killed(tmp_path: Path) -> None:
    """A holder killed mid-fetch holds nothing: the kernel releases an flock with its process."""
    lock = tmp_path / "locks" / "x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\nfrom bulldozer import locks\n"
            f"with locks.held(Path({str(lock)!r}), 'x'):\n    print('held', flush=True)\n    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with locks.held(lock, "x", wait=0.5) as holding:
        assert not holding  # still held by the other process: given up after the wait
    assert time.monotonic() - started >= 0.5
    holder.kill()
    holder.wait()
    with locks.held(lock, "x", wait=5) as holding:
        assert holding
