"""The interpreter ``scripts/bootstrap.sh`` makes a new venv with (``--which-python``): PYTHON
when set; else the release of the first of python3.12, python3.11 and python3 on PATH that
answers, in its fastest build on PATH at the probe. Each fake interpreter here answers the probe as a real
one does (minor release, seconds, real path, tab-separated), or fails as one without venv or
ensurepip does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("sort", "cut", "head", "dirname", "awk")  # what the script runs before it answers


def fake(folder: Path, name: str, answer: str | None) -> None:
    """``folder``/``name``: an interpreter that answers the probe with ``answer`` (a failing one
    for None)."""
    folder.mkdir(parents=True, exist_ok=True)
    body = f"printf '{answer}\\n'" if answer is not None else "exit 1"
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


def which_python(tmp_path: Path, folders: list[str], python: str | None = None) -> subprocess.CompletedProcess[str]:
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    path = ":".join([*(str(tmp_path / f) for f in folders), str(tools)])
    env = {"PATH": path, **({"PYTHON": python} if python else {})}
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(REPO / "scripts" / "bootstrap.sh"), "--which-python"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.fixture
def interpreters(tmp_path: Path) -> Path:
    fake(tmp_path / "shims", "python3.11", "11\t0.028\t/opt/pyenv/3.11.7/bin/python3.11")
    fake(tmp_path / "shims", "python3", "11\t0.027\t/opt/pyenv/3.11.7/bin/python3.11")
    fake(tmp_path / "system", "python3.11", "11\t0.022\t/usr/bin/python3.11")
    fake(tmp_path / "system", "python3", "11\t0.023\t/usr/bin/python3.11")
    fake(tmp_path / "broken", "python3.12", None)  # no venv module, or not runnable
    fake(tmp_path / "newer", "python3.12", "12\t0.040\t/opt/python3.12/bin/python3.12")
    return tmp_path


def test_of_one_release_on_path_the_fastest_is_taken_wherever_it_stands(interpreters: Path) -> None:
    for order in (["shims", "system"], ["system", "shims"], ["broken", "shims", "system"]):
        made = which_python(interpreters, order)
        assert (made.returncode, made.stdout) == (0, "/usr/bin/python3.11\n"), (order, made.stderr)


def test_the_release_is_the_first_names_that_answers_and_speed_chooses_its_build(interpreters: Path) -> None:
    made = which_python(interpreters, ["shims", "system", "newer"])
    assert (made.returncode, made.stdout) == (0, "/opt/python3.12/bin/python3.12\n"), made.stderr
    # a python3 of a newer release than the python3.11 beside it: 3.11 is still the release
    fake(interpreters / "next", "python3", "13\t0.010\t/opt/python3.13/bin/python3.13")
    made = which_python(interpreters, ["next", "shims", "system"])
    assert (made.returncode, made.stdout) == (0, "/usr/bin/python3.11\n"), made.stderr
    made = which_python(interpreters, ["next", "broken"])  # and the release when it is the only one
    assert (made.returncode, made.stdout) == (0, "/opt/python3.13/bin/python3.13\n"), made.stderr


def test_python_names_the_interpreter_and_an_old_one_is_refused(interpreters: Path) -> None:
    system = str(interpreters / "system" / "python3.11")
    (interpreters / "system" / "python3.11").write_text("#!/bin/sh\nexit 0\n")  # passes the version check
    made = which_python(interpreters, ["shims"], python=system)
    assert (made.returncode, made.stdout) == (0, f"{system}\n"), made.stderr
    (interpreters / "system" / "python3.11").write_text("#!/bin/sh\nexit 1\n")  # a 3.10 fails it
    made = which_python(interpreters, ["shims"], python=system)
    assert made.returncode == 1 and made.stdout == ""
    assert made.stderr == f"bootstrap: PYTHON={system} is not a Python 3.11 or newer\n"


def test_no_interpreter_that_answers_is_one_line(interpreters: Path) -> None:
    made = which_python(interpreters, ["broken"])
    assert made.returncode == 1 and made.stdout == ""
    assert made.stderr.count("\n") == 1 and "Python 3.11 or newer" in made.stderr
