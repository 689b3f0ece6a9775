"""The ``bulldozer`` entry point ends its process as soon as the command is done
(bulldozer.cli.process.end_when_done): with the command's exit code and output, after its
threads finished and its exit handlers ran (a buffered log is flushed), without tearing the
interpreter down; an unexpected error still ends the usual way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# bulldozer.cli.main replaced by a command that starts a thread, buffers a log line, leaves an
# object only the interpreter's teardown would free, and ends as ENDING says
DRIVER = """
import sys, threading, time, types
ENDING, LOG = sys.argv[1], sys.argv[2]

def command():
    import logging, logging.handlers
    handler = logging.handlers.MemoryHandler(100, target=logging.FileHandler(LOG))
    logging.getLogger("t").addHandler(handler)
    logging.getLogger("t").warning("logged")  # buffered until logging shuts down
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()

    class Late:
        def __del__(self):
            print("torn down", flush=True)

    sys.modules["bulldozer.cli.main"].late = Late()
    print("output")
    if ENDING == "return":
        return
    if ENDING == "message":
        sys.exit("error: a message")
    if ENDING == "crash":
        raise RuntimeError("unexpected")
    sys.exit(int(ENDING))

fake = types.ModuleType("bulldozer.cli.main")
fake.main = command
sys.modules["bulldozer.cli.main"] = fake
sys.argv = ["bulldozer", "validate", "job.yaml"]
from bulldozer.cli.entry import main
main()
"""


@pytest.mark.parametrize(("ending", "code"), [("return", 0), ("0", 0), ("3", 3), ("message", 1)])
def test_the_command_ends_the_process_with_its_code_output_threads_and_log(
    tmp_path: Path, ending: str, code: int
) -> None:
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-c", DRIVER, ending, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert done.stdout.splitlines() == ["output", "thread done"]  # no "torn down": no teardown
    assert log.read_text() == "logged\n"
    assert done.stderr == ("error: a message\n" if ending == "message" else "")


def test_an_unexpected_error_ends_the_usual_way(tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-c", DRIVER, "crash", str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "RuntimeError: unexpected" in done.stderr
    assert "torn down" in done.stdout.splitlines()
    assert log.read_text() == "logged\n"
