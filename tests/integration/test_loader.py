"""The warm loader (bulldozer.cli.loader): a ``bulldozer run`` handed over to it is the same
command — the caller's arguments, working directory, environment, output and exit code —
run in a process that already imported everything, with the loader's embedded DAL; it
dies with its caller; and with no loader (or ``BULLDOZER_LOADER=off``) nothing changes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulldozer.cli.loader import loader_folder, registry, registry_link, socket_path
from bulldozer.cli.loader.client import _loaders, status
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()


#: the Python caller: the ``bulldozer`` command's entry point, which hands a run over
PYTHON = [sys.executable, "-m", "bulldozer.cli.entry"]
#: the native launcher scripts/bootstrap.sh installs as the ``bulldozer`` command (native/launcher)
LAUNCHER = Path(sys.executable).parent / "bulldozer"


def _native() -> list[str]:
    """The native caller: the installed ``bulldozer`` command, which must be the launcher."""
    assert LAUNCHER.read_bytes()[:4] == b"\x7fELF", f"{LAUNCHER} is not the native launcher (scripts/bootstrap.sh)"
    return [str(LAUNCHER)]


@pytest.fixture(params=["python", "native"])
def caller(request: pytest.FixtureRequest) -> list[str]:
    """Each hand-over test runs through both callers: they must do the same."""
    return PYTHON if request.param == "python" else _native()


def _bulldozer(home: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               caller: list[str] = PYTHON) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``bulldozer ARGS`` through ``caller`` (which hands a run over)."""
    return subprocess.run(
        [*caller, *args],
        capture_output=True, text=True, timeout=120, cwd=cwd or REPO,
        env={**os.environ, "BULLDOZER_HOME": str(home), **(env or {})},
    )  # fmt: skip


def test_status_without_a_loader_says_so_and_exits_3(tmp_path: Path) -> None:
    """``loader status`` for a home no loader serves: one line, exit code 3 (its ``--help``
    says so), for a script to tell "none" from a running loader (0) and a failure (1)."""
    said = _bulldozer(tmp_path / "nowhere", "loader", "status")
    assert (said.returncode, said.stdout.strip(), said.stderr) == (3, f"no loader runs for {tmp_path / 'nowhere'}", "")
    helped = _bulldozer(tmp_path / "nowhere", "loader", "status", "--help")
    assert "3 when none does" in " ".join(helped.stdout.split()), helped.stdout


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("loader")
    create_sample_warehouse(home, rows=2_000)
    (home / "job.yaml").write_text(TEMPLATE)
    started = _bulldozer(home, "loader", "start")
    assert started.returncode == 0, started.stdout + started.stderr
    yield home
    stopped = _bulldozer(home, "loader", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert status(home) is None and not socket_path(home).exists()
    assert not registry_link(home).exists()  # unlisted


def _dal_starts(home: Path) -> int:
    """How many embedded DALs have started in this home (each logs one line as it serves)."""
    return sum(p.read_text().count("KV DAL serving") for p in (home / "logs").glob("dal-*.log"))


def test_a_run_is_handed_over_and_uses_the_loaders_dal(home: Path, caller: list[str]) -> None:
    before = status(home)
    assert before is not None and before["dal"]
    starts = _dal_starts(home)
    done = _bulldozer(
        home, "run", "job.yaml", "--json", "-q", cwd=home, caller=caller
    )  # a path relative to the caller's cwd
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert (record["outcome"], record["rows"]) == ("succeeded", 2_000)
    assert record["store"] == f"embedded ({home / 'kv'})"
    after = status(home)
    assert after is not None and after["served"] == before["served"] + 1
    assert _dal_starts(home) == starts  # no DAL was started for the run: the loader's answered


def test_the_same_command_runs_here_without_the_loader(home: Path, caller: list[str]) -> None:
    served = status(home)["served"]  # type: ignore[index]
    starts = _dal_starts(home)
    done = _bulldozer(
        home, "run", str(home / "job.yaml"), "--json", "-q", env={"BULLDOZER_LOADER": "off"}, caller=caller
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 2_000
    assert status(home)["served"] == served  # type: ignore[index]
    assert _dal_starts(home) == starts + 1  # it started its own DAL


def test_a_caller_choosing_another_data_plane_gets_the_dal_it_chose(home: Path) -> None:
    """``BULLDOZER_DATA_PLANE`` decides how an embedded DAL serves, and the loader's DAL was
    started under the loader's settings: a caller that chose the Python plane (to work
    around kvd, say) was served by the loader's native one. The run is still handed over,
    and starts the DAL it chose."""
    served = status(home)["served"]  # type: ignore[index]
    starts = _dal_starts(home)
    logged = {p: len(p.read_text()) for p in (home / "logs").glob("dal-*.log")}
    done = _bulldozer(home, "run", str(home / "job.yaml"), "--json", "-q", env={"BULLDOZER_DATA_PLANE": "python"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 2_000
    assert status(home)["served"] == served + 1  # type: ignore[index]
    assert _dal_starts(home) == starts + 1
    new = "".join(p.read_text()[logged.get(p, 0) :] for p in (home / "logs").glob("dal-*.log"))
    assert "(data plane: python" in new and "(data plane: native" not in new, new


def test_the_callers_environment_and_errors_are_the_commands(home: Path, caller: list[str]) -> None:
    """The child reads the caller's environment, not the loader's: a spec's ${VAR} is the
    caller's variable, and without it the run fails as it would here, with the same one
    line and exit code."""
    spec = home / "env.yaml"
    spec.write_text(TEMPLATE.replace("  # endpoint: dal.example.com:7110", "  endpoint: ${LOADER_TEST_DAL}"))
    served = status(home)["served"]  # type: ignore[index]
    exposed = {"BULLDOZER_SPEC_VARIABLES": "LOADER_TEST_*"}
    done = _bulldozer(home, "run", str(spec), "-q", env={"LOADER_TEST_DAL": "embedded", **exposed}, caller=caller)
    assert done.returncode == 0, done.stderr
    assert status(home)["served"] == served + 1  # type: ignore[index]
    there = _bulldozer(home, "run", str(spec), "-q", env=exposed, caller=caller)
    assert status(home)["served"] == served + 2  # type: ignore[index]
    here = _bulldozer(home, "run", str(spec), "-q", env={"BULLDOZER_LOADER": "off", **exposed}, caller=caller)
    assert there.returncode == here.returncode == 2
    assert there.stderr == here.stderr and "LOADER_TEST_DAL is not set" in there.stderr, there.stderr
    assert "Traceback" not in there.stderr
    bad = _bulldozer(home, "run", str(home / "missing.yaml"), caller=caller)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("no such file"), bad.stderr


@contextlib.contextmanager
def _stuck_run(
    home: Path, output: int = subprocess.DEVNULL, caller: list[str] = PYTHON
) -> Iterator[subprocess.Popen[str]]:
    """A caller whose run the loader took and that waits, until the test ends it, on a DAL
    that accepts connections but never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {**os.environ, "BULLDOZER_HOME": str(home), "BULLDOZER_ENDPOINT": f"127.0.0.1:{silent.getsockname()[1]}"}
        proc = subprocess.Popen([*caller, "run", str(home / "job.yaml"), "-q"],
                                env=env, stdout=output, stderr=output, text=True)  # fmt: skip
        deadline = time.monotonic() + 30
        while (status(home) or {}).get("running", 0) == 0:
            assert proc.poll() is None and time.monotonic() < deadline, "the run never reached the loader"
            time.sleep(0.05)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_command_dies_with_its_caller(home: Path, caller: list[str]) -> None:
    """A caller killed mid-command takes its command with it (as a one-shot process would
    be gone)."""
    with _stuck_run(home, caller=caller) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while (status(home) or {}).get("running", 1) != 0:
            assert time.monotonic() < deadline, "the command outlived its caller"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Is ``pid`` running (not a zombie, not dead)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _forks(home: Path, commands: bool) -> list[int]:
    """The live children the loader forked itself (not its DAL): its commands, which lead
    their own group, or (``commands`` False) its spare. A command that has exited and waits
    to be reaped is still listed: it is left out (under load, one was killed instead)."""
    loader = (status(home) or {})["pid"]
    itself = Path(f"/proc/{loader}/cmdline").read_bytes()
    children = [int(pid) for pid in Path(f"/proc/{loader}/task/{loader}/children").read_text().split()]
    return sorted(
        pid for pid in children
        if _alive(pid) and Path(f"/proc/{pid}/cmdline").read_bytes() == itself and (os.getpgid(pid) == pid) is commands
    )  # fmt: skip


def _soon(home: Path, commands: bool, unlike: list[int]) -> list[int]:
    """``_forks`` once it lists some other than ``unlike`` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while (found := _forks(home, commands)) in ([], unlike) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_a_command_killed_in_the_loader_gives_its_caller_the_exit_code(home: Path, caller: list[str]) -> None:
    """A command says its exit code itself as it ends; one that cannot (killed) gets it said
    by the loader, from its exit status."""
    with _stuck_run(home, caller=caller) as proc:
        commands = _soon(home, True, [])  # counted as the loader forks it; the child then makes its group
        assert len(commands) == 1, commands
        os.kill(commands[0], signal.SIGKILL)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL


def test_a_command_runs_in_the_child_the_loader_forked_ahead_for_it(home: Path) -> None:
    """The loader forks the child the next command gets ahead of it (a spare, waiting): the
    command runs in it, and the loader forks the next one once the command has ended."""
    spare = _soon(home, False, [])
    assert len(spare) == 1, spare
    with _stuck_run(home):
        assert _soon(home, True, []) == spare  # the command runs in the spare
        assert _forks(home, False) == []  # none is forked while it runs
    following = _soon(home, False, spare)
    assert len(following) == 1 and following != spare, following


@pytest.mark.parametrize(
    ("signum", "code", "line"), [(signal.SIGINT, 130, "error: interrupted"), (signal.SIGTERM, 143, "error: terminated")]
)
def test_ctrl_c_and_sigterm_reach_the_command(home: Path, caller: list[str], signum: int, code: int, line: str) -> None:
    with _stuck_run(home, subprocess.PIPE, caller) as proc:
        time.sleep(0.3)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert err.strip().splitlines()[-1] == line


def test_the_caller_hands_over_without_importing_the_settings(home: Path) -> None:
    """The caller finds the loader in the user's registry and leaves the command's home to
    it: it imports neither the settings nor pydantic (≈ 0.15–0.2 s of a handed-over run)."""
    assert registry_link(home).resolve() == socket_path(home)
    served = status(home)["served"]  # type: ignore[index]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bulldozer.cli.entry", "run", "job.yaml", "-q"],
        capture_output=True, text=True, timeout=120, cwd=home, env={**os.environ, "BULLDOZER_HOME": "."},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert status(home)["served"] == served + 1  # type: ignore[index]  # a relative home, from the caller's cwd
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "bulldozer.cli.loader.client" in imported  # the caller's own imports are seen
    assert not [m for m in imported if m.startswith(("bulldozer.settings", "pydantic", "pyarrow", "grpc"))]
    # nor the standard library's heavier modules: the caller's start is what a warm run pays
    assert not [m for m in imported if m in ("typing", "pathlib", "hashlib", "bulldozer.errors")]
    # nor sockets, signals and JSON through their Python modules (enum, re: the C modules do)
    assert not [m for m in imported if m in ("enum", "re", "json", "socket", "signal", "selectors")]


def test_a_run_shows_its_progress_in_colour_on_its_callers_terminal(home: Path, caller: list[str]) -> None:
    """The loader has no terminal, but the command it runs has its caller's: on a terminal,
    the run's closing line is styled, as the same command run here styles it (the command
    line's consoles are made in the loader, and made again for each command it runs)."""
    import pty

    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}

    def on_a_terminal(env: dict[str, str]) -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                [*caller, "run", "job.yaml"],
                stdin=follower, stdout=follower, stderr=follower, cwd=home, close_fds=True,
                env={**base, "BULLDOZER_HOME": str(home), "TERM": "xterm-256color", **env},
            )  # fmt: skip
            os.close(follower)
            out = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal's other end closed: the command is done
                    break
                if not chunk:
                    break
                out += chunk
            return proc.wait(timeout=120), out
        finally:
            os.close(leader)

    served = status(home)["served"]  # type: ignore[index]
    code, there = on_a_terminal({})
    assert code == 0, there.decode(errors="replace")
    assert status(home)["served"] == served + 1  # type: ignore[index]
    code, here = on_a_terminal({"BULLDOZER_LOADER": "off"})
    assert code == 0, here.decode(errors="replace")
    assert b"\x1b[32m" in here  # the green tick, from a console made on a terminal
    assert b"\x1b[32m" in there, there.decode(errors="replace")
    code, plain = on_a_terminal({"NO_COLOR": "1"})  # the caller's environment, read again
    assert code == 0 and b"\x1b[32m" not in plain, plain.decode(errors="replace")
    assert status(home)["served"] == served + 2  # type: ignore[index]  # in the loader, not here


def test_a_run_of_another_home_is_refused_and_runs_here(home: Path, tmp_path: Path, caller: list[str]) -> None:
    """Every loader of the user is asked; one for another home refuses (so does any loader
    when the caller says BULLDOZER_LOADER=off), and the command runs in the caller."""
    other = tmp_path / "other"
    create_sample_warehouse(other, rows=1_500)
    served = status(home)["served"]  # type: ignore[index]
    done = _bulldozer(other, "run", str(home / "job.yaml"), "--json", "-q", caller=caller)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 1_500
    assert status(home)["served"] == served  # type: ignore[index]


def test_a_loader_older_than_the_installation_runs_nothing_more(tmp_path: Path, caller: list[str]) -> None:
    """An upgrade while a loader runs (here: its data plane's binary rebuilt; likewise any
    file of the package, or an installed distribution): the loader kept forking its old
    code, imports and DAL, and a spec using what the upgrade added was refused by the run
    that ``validate`` passed. It now refuses the command, which runs on its own, says so
    once, and stops; ``loader status`` and ``loader start`` say it is older."""
    import shutil

    from bulldozer.kv.server.native import kvd_binary

    home = tmp_path / "h"
    create_sample_warehouse(home, rows=1_500)
    (home / "job.yaml").write_text(TEMPLATE)
    built = kvd_binary()
    assert built is not None
    kvd = tmp_path / "bulldozer-kvd"
    shutil.copy2(built, kvd)
    env = {"BULLDOZER_KVD": str(kvd)}
    started = _bulldozer(home, "loader", "start", env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        first = _bulldozer(home, "run", str(home / "job.yaml"), "-q", env=env, caller=caller)
        assert first.returncode == 0 and first.stderr == "", first.stderr
        assert status(home)["served"] == 1  # type: ignore[index]
        shutil.copy(built, tmp_path / "rebuilt")
        (tmp_path / "rebuilt").replace(kvd)  # as a build replaces it

        said = _bulldozer(home, "loader", "status", env=env)
        assert said.returncode == 0 and "runs code older than this installation" in said.stdout, said.stdout
        again = _bulldozer(home, "loader", "start", env=env)
        assert again.returncode == 1 and "with code older than this installation" in again.stderr, again.stderr

        second = _bulldozer(home, "run", str(home / "job.yaml"), "--json", "-q", env=env, caller=caller)
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["rows"] == 1_500
        assert second.stderr.strip().splitlines() == [
            f"warning: the loader at {registry_link(home)} ran code older than this installation; it is stopping, "
            "and this command runs on its own (bulldozer loader start starts a loader with the new code)"
        ]
        deadline = time.monotonic() + 15
        while status(home) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status(home) is None
        renewed = _bulldozer(home, "loader", "start", env=env)
        assert renewed.returncode == 0, renewed.stdout + renewed.stderr
        third = _bulldozer(home, "run", str(home / "job.yaml"), "-q", env=env, caller=caller)
        assert third.returncode == 0 and third.stderr == "", third.stderr
        assert status(home)["served"] == 1  # type: ignore[index]
    finally:
        _bulldozer(home, "loader", "stop", env=env)


def test_a_registry_others_may_enter_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry folder someone else could have made or written into is ignored: the
    caller's environment (its secrets) goes to no socket found there."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = Path(registry())
    folder.mkdir(mode=0o700)
    (folder / "x.sock").symlink_to(tmp_path / "nowhere.sock")
    assert _loaders() == [str(folder / "x.sock")]
    folder.chmod(0o733)
    assert _loaders() == []


def test_the_native_launcher_uses_the_registry_the_python_caller_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher finds the registry where ``registry()`` says, sends to the sockets listed
    there (every command: here ``--version``), and to none while others may enter it. The
    socket here takes the request and closes without a reply: the command then runs here."""
    import threading

    short = Path(tempfile.mkdtemp(prefix="reg", dir="/tmp"))  # a socket's path must be short
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
        folder = Path(registry())
        folder.mkdir(mode=0o700)
        requests: list[bytes] = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(folder / "x.sock"))
            listener.listen()

            def take() -> None:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except OSError:  # closed: the test is done
                        return
                    with conn:
                        data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
                        for fd in fds:  # the caller's output: held, the caller's pipes stay open
                            os.close(fd)
                        requests.append(data)

            taker = threading.Thread(target=take, daemon=True)
            taker.start()
            for mode, sent in ((0o733, 0), (0o700, 1)):
                folder.chmod(mode)
                done = _bulldozer(tmp_path, "--version", caller=_native())
                assert done.returncode == 0 and done.stdout.startswith("bulldozer "), done.stderr
                assert len(requests) == sent, oct(mode)
            listener.shutdown(socket.SHUT_RDWR)
        assert b'"argv": ["--version"]' in requests[0]
    finally:
        shutil.rmtree(short)


def test_only_its_user_can_reach_it(home: Path) -> None:
    folder = loader_folder(home)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(socket_path(home).stat().st_mode) == 0o600


def test_a_second_loader_for_the_home_is_refused(home: Path) -> None:
    again = _bulldozer(home, "loader", "serve")
    assert again.returncode != 0
    assert "a loader already serves" in again.stderr and "Traceback" not in again.stderr


def test_a_malformed_request_does_not_stop_it(home: Path) -> None:
    """Whatever a connection sends — not JSON, the wrong shape, nothing — the loader drops
    it and serves the next command."""
    import struct

    for payload in (b"not json", json.dumps(["a", "list"]).encode(), json.dumps({"argv": "run"}).encode(), b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(socket_path(home)))
            if payload:
                sock.sendall(struct.pack("!I", len(payload)) + payload)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            assert sock.recv(100) == b""  # closed without an answer
    done = _bulldozer(home, "run", str(home / "job.yaml"), "-q")
    assert done.returncode == 0, done.stderr
    assert status(home) is not None


# A command run in the loader, as its child runs it: the loader's imports (``preload``) and
# its warm DAL, then each command in turn; prints, per command, the modules it imported that
# were not yet imported (the table is changed between the two runs, outside the counting).
_AS_THE_LOADERS_CHILD = """
import json, sys
from pathlib import Path

from bench import feature_table
from bulldozer.cli import process
from bulldozer.cli.loader.server import preload
from bulldozer.kv.connect import embedded_store_path, start_embedded_dal, use_warm_dal
from bulldozer.versioning.run_state import run_record_adapter

home, spec = Path(sys.argv[1]), sys.argv[2]
process.claim()  # as the loader's own command line does before it preloads
preload()
with start_embedded_dal(home) as dal:
    dal.wait()
    use_warm_dal(embedded_store_path(home), dal.address, dal.plane)
    from bulldozer.cli.main import main

    for changed in (False, True):
        if changed:
            feature_table.change_one_file(home, 4_000, 4, 1, seed=5)
        print("unbuilt:", len(process.unbuilt_models()), file=sys.stderr)
        before = set(sys.modules)
        sys.argv = ["bulldozer", "run", spec, "--json", "-q"]
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        print("imported:", json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr)
        print("run record adapters built:", run_record_adapter.cache_info().misses, file=sys.stderr)
"""


def test_a_run_in_the_loader_imports_nothing(tmp_path: Path) -> None:
    """Everything a run imports on its way is imported by the loader first (``PRELOAD``),
    for a full run and for a delta, the command line's own modules included, and every
    pydantic model a one-shot run would build when first used is built, the run records'
    reader included (20 ms of a warm delta)."""
    from bench import feature_table

    feature_table.build_files(tmp_path, 4_000, 4)
    spec = feature_table.write_spec(tmp_path / "delta.yaml", "features", "delta")
    done = subprocess.run(
        [sys.executable, "-c", _AS_THE_LOADERS_CHILD, str(tmp_path), str(spec)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "BULLDOZER_HOME": str(tmp_path), "BULLDOZER_ENDPOINT": "embedded"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs, at, text = [], 0, done.stdout.strip()
    while at < len(text):  # the two runs' JSON, one after the other
        run, at = json.JSONDecoder().raw_decode(text, at)
        runs.append(run)
        at += len(text[at:]) - len(text[at:].lstrip())
    assert [r["mode"] for r in runs] == ["full", "delta"]
    imported = [json.loads(line.split(": ", 1)[1]) for line in done.stderr.splitlines() if line.startswith("imported:")]
    assert len(imported) == 2
    for run, modules in zip(("full", "delta"), imported, strict=True):
        assert not modules, f"the {run} run imported what the loader had not: {modules}"
    # and built every pydantic model a one-shot run builds when first used (process.DEFERRED_MODELS)
    unbuilt = [line for line in done.stderr.splitlines() if line.startswith("unbuilt:")]
    assert unbuilt == ["unbuilt: 0", "unbuilt: 0"], unbuilt
    adapters = [line for line in done.stderr.splitlines() if line.startswith("run record adapters built:")]
    assert adapters == ["run record adapters built: 1"] * 2, adapters  # the one preload built


def test_a_deep_home_and_temporary_directory_take_a_run_and_a_loader(tmp_path: Path, caller: list[str]) -> None:
    """A Unix socket's path has at most 107 bytes. With a $TMPDIR deep in a scheduler's work
    folder the embedded DAL could not listen (every run failed at its schema stage), and with
    a deep home the loader could not (``AF_UNIX path too long``): both work, and nothing
    is left in either folder."""
    deep = tmp_path / ("t" * 60) / ("u" * 60)
    scratch, home = deep / "tmp", deep / "home"
    scratch.mkdir(parents=True)
    assert len(str(scratch)) > 107 and len(str(socket_path(home))) > 107
    create_sample_warehouse(home, rows=2_000)
    (home / "job.yaml").write_text(TEMPLATE)
    env = {"TMPDIR": str(scratch), "BULLDOZER_LOADER": "off"}
    alone = _bulldozer(home, "run", "job.yaml", "--json", "-q", cwd=home, env=env)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["rows"] == 2_000 and alone.stderr == ""
    started = _bulldozer(home, "loader", "start", env={"TMPDIR": str(scratch)})
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        served = status(home)
        assert served is not None and served["dal"]
        warm = _bulldozer(
            home, "run", "job.yaml", "--json", "-q", cwd=home, env={"TMPDIR": str(scratch)}, caller=caller
        )
        assert warm.returncode == 0, warm.stderr
        assert json.loads(warm.stdout)["rows"] == 2_000
        assert status(home)["served"] == served["served"] + 1  # type: ignore[index]
    finally:
        stopped = _bulldozer(home, "loader", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert status(home) is None and not socket_path(home).exists()
    assert list(scratch.iterdir()) == []


def test_the_native_launcher_runs_what_no_loader_takes_in_python(home: Path, tmp_path: Path) -> None:
    """The native launcher sends every command; the loader refuses what it does not take
    (``takes``: the Python caller's rule), and the command then runs in Python, as the
    Python caller runs it: the same output and exit code, nothing served. With no loader
    registered at all, a run runs in Python too."""
    native = _native()
    served = status(home)["served"]  # type: ignore[index]
    for args in (["--version"], ["validate", "job.yaml"], ["run", "job.yaml", "--help"], ["namespace", "nope"]):
        there = _bulldozer(home, *args, cwd=home, caller=native)
        here = _bulldozer(home, *args, cwd=home)

        # the usage lines name the command as it was started (a help's padded to the width)
        def named(text: str) -> list[str]:
            return [line.rstrip() for line in text.replace("python -m bulldozer.cli.entry", "bulldozer").splitlines()]

        assert (there.returncode, named(there.stdout), named(there.stderr)) == (
            here.returncode,
            named(here.stdout),
            named(here.stderr),
        ), args
        assert there.returncode == (2 if args[0] == "namespace" else 0), there.stderr
    assert status(home)["served"] == served  # type: ignore[index]
    alone = _bulldozer(home, "run", "job.yaml", "--json", "-q", cwd=home, caller=native,
                       env={"XDG_RUNTIME_DIR": str(tmp_path)})  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["rows"] == 2_000
    assert status(home)["served"] == served  # type: ignore[index]


def test_the_native_launcher_sends_bytes_no_encoding_has_as_they_are(home: Path, tmp_path: Path) -> None:
    """Python holds a byte no UTF-8 sequence takes (a working directory's, a variable's) as a
    lone surrogate, and the loader turns it back into that byte: the launcher's request says
    it so (``\\udcff``), so the command runs in the same folder, with the same environment."""
    folder = tmp_path / os.fsdecode(b"caf\xc3\xa9 \xff")
    folder.mkdir()
    (folder / "job.yaml").write_text(TEMPLATE)
    served = status(home)["served"]  # type: ignore[index]
    done = subprocess.run(
        [*_native(), "run", "job.yaml", "--json", "-q"], capture_output=True, text=True, timeout=120, cwd=folder,
        env={**os.environb, b"BULLDOZER_HOME": os.fsencode(home), b"LOADER_TEST_BYTES": b"\xfe\"\\\n\xe2\x9c\x93"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 2_000
    assert status(home)["served"] == served + 1  # type: ignore[index]  # in the loader, in that folder
