"""The loader process (``bulldozer loader serve``): preloads, keeps an embedded DAL, forks
one child per handed-over command (see the package's docstring).

It stays single-threaded so that forking it is safe: one ``selectors`` loop waits on the
listening socket, a self-pipe for SIGTERM/SIGINT, and each child's pidfd (readable when
the child exits, then its exit code goes back to the caller). Nothing in it opens a gRPC
channel or a thread pool; the children do, after the fork.

The child a command gets is forked ahead (a *spare*, ``_Spare``): it waits for a command
(``_await``), and the loader hands it the next one it takes. The loader forks a spare as it
starts and whenever a command has ended and none is left (not as it hands one over: on two
cores that fork slowed the command it ran beside), and forks a command's child itself when
it has none (commands at once, a spare killed or of an earlier DAL). A fork of the loader (some
300 MiB of pages) took 5-10 ms of a warm run's start; a spare takes it off the command's path.
2,000-row runs through the loader, alternating with one forking each command (79 each, a
busy machine): paired median -9.8 ms, faster in 49 of 79 (forking the next spare while the
command ran: -3.1 ms, 46 of 79).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bulldozer.cli.loader import (
    REQUEST_HEADER,
    loader_folder,
    option,
    registry,
    registry_link,
    socket_path,
    takes,
)
from bulldozer.cli.loader.installed import CodeWatch, Installed
from bulldozer.errors import BackendUnavailableError
from bulldozer.sockets import at_unix_path

__all__ = ["PRELOAD", "serve"]

log = logging.getLogger("bulldozer.cli.loader")

#: What the children find imported: everything a local run imports on its way, the command
#: line's own modules included (their rich consoles read the terminal when they are made:
#: each child remakes them on its caller's, ``remake_consoles``), and ``preload`` makes the
#: run command's click command. A test runs a full and a delta run as a child does and fails
#: on any module they import.
PRELOAD = (
    "bulldozer.cli.main",
    "bulldozer.cli.run_cmds",
    "typer",
    "typer._adapters",  # typer's on the first command it runs
    "typer._click.decorators",
    "rich.console",
    "rich.progress",
    "bulldozer.cli.consoles",  # the command line's consoles, made when a command first prints
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.compute",
    "pyiceberg.table",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
    "grpc",
    "bulldozer.kv.client",
    "bulldozer.kv.connect",
    "bulldozer.load.runner",
    "bulldozer.load.engines.local",
    "bulldozer.load.encoder.encode",
    "bulldozer.schema.iceberg",
    "bulldozer.spec.loader",
    "bulldozer.warehouse.catalog",
    "bulldozer.warehouse.file_io",  # a run's tables read with it
    "bulldozer.schema.table_check",  # the schema stage checks the columns the spec names
    # imported on first use by runs: a warm delta imported them itself (its schema stage: 23 -> 17 ms)
    "numpy.ma",  # pyarrow.compute.take checks its argument against numpy.ma.MaskedArray
    "grpc._channel",  # grpc imports its channel on the first insecure_channel()
    "grpc.experimental",
    "grpc_health.v1.health_pb2_grpc",
    "grpc_tools.protoc",  # bulldozer.schema.compile
    "pyiceberg.catalog.noop",
    "pyiceberg.avro.decoder_fast",
    "grpc_status.rpc_status",  # the DAL's errors are read with it (a first run's missing alias)
    "google.rpc.error_details_pb2",
    "google.protobuf.duration_pb2",
    "pwd",
    "bulldozer.kv.columnar",
    "bulldozer.load.delta",
)

_MAX_REQUEST = 16 * 1024 * 1024


@dataclass
class _Child:
    pid: int
    conn: socket.socket
    pidfd: int


@dataclass
class _Spare:
    """A child forked ahead of the next command (``_spawn_spare``): it waits on its end of
    ``channel`` for one (``_await``), and ends when the channel closes without one."""

    pid: int
    channel: socket.socket  # the loader's end
    pidfd: int
    dal: Any  # the warm DAL it was forked with: a spare of an earlier one is not used


#: what the selector's key says of a spare's pidfd (a command's says its pid)
_SPARE = "spare"


@dataclass
class _State:
    home: Path
    listener: socket.socket
    selector: selectors.BaseSelector
    wake: socket.socket
    code: CodeWatch  # whether the installed code changed since it started
    dal: Any = None  # the warm embedded DAL (bulldozer.kv.connect.EmbeddedDal) or None
    children: dict[int, _Child] = field(default_factory=dict)
    spare: _Spare | None = None
    served: int = 0
    started: float = field(default_factory=time.time)
    stopping: bool = False


def preload() -> float:
    """Import what a run imports; the seconds it took."""
    from bulldozer.cli import process

    process.without_pandas()  # as a local run does, before anything imports pyarrow.dataset
    began = time.perf_counter()
    for name in PRELOAD:
        importlib.import_module(name)
    from bulldozer.cli.main import parse_ahead

    parse_ahead(["run", "spec.yaml"])  # what every child would do again: 9-10 ms to make, 3-4 to parse
    process.build_deferred_models()  # or every child would build those it uses, for every run
    from bulldozer.versioning.run_state import run_record_adapter

    run_record_adapter()  # a run reads its live version's record: 20 ms of a warm delta's 0.22 s
    from bulldozer.schema.compile import compiler_identity

    compiler_identity()  # the key of a run's kept job schema: 1 ms of every child otherwise
    return time.perf_counter() - began


def _listen(path: Path) -> socket.socket:
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # only this user can reach the socket
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            at_unix_path(path, probe.connect)
        except OSError:
            path.unlink()  # a loader that died left it
        else:
            raise BackendUnavailableError(f"a loader already serves {folder.parent} (its socket {path} answers)")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    at_unix_path(path, listener.bind)
    os.chmod(path, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    return listener


def serve(home: Path, warm_dal: bool = True) -> int:
    """Run the loader for ``home`` until SIGTERM, SIGINT or SIGHUP; the exit code."""
    seconds = preload()
    folder = loader_folder(home)
    path = socket_path(home)
    listener = _listen(path)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal it ran in closed
        signal.signal(sig, lambda *_: None)  # handled in the loop, through the wakeup fd
    selector = selectors.DefaultSelector()
    state = _State(home, listener, selector, wake_r, CodeWatch(Installed.here()))
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    (folder / "loader.pid").write_text(str(os.getpid()))
    link = _register(home, path)
    with contextlib.ExitStack() as stack:
        if warm_dal:
            state.dal = _start_dal(stack, home)
        gc.freeze()  # what is loaded now is shared with every child, untouched by collections
        _spawn_spare(state)
        log.info("loader ready for %s in %.2f s of imports (pid %d, socket %s)", home, seconds, os.getpid(), path)
        try:
            _loop(state, stack)
        finally:
            _discard_spare(state)
            for child in list(state.children.values()):  # they run on; their callers get no code
                _forget(state, child)
            selector.close()
            listener.close()
            state.code.close()
            if link is not None and _links_to(link, path):
                link.unlink()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(FileNotFoundError):
                (folder / "loader.pid").unlink()
    log.info("loader stopped after %d command(s)", state.served)
    return 0


def _register(home: Path, path: Path) -> Path | None:
    """List this loader in the user's registry (``registry``), dropping the links of loaders
    that are gone; its link, or None when the registry cannot be this user's alone (no
    caller then finds this loader: commands run on their own)."""
    folder = Path(registry())
    try:
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        info = folder.lstat()
        if not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()):
            raise PermissionError("it is not this user's folder")
        os.chmod(folder, 0o700)
        for other in folder.glob("*.sock"):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(other))
            except (ConnectionRefusedError, FileNotFoundError):
                other.unlink(missing_ok=True)  # its loader died without unlisting it
            except OSError:
                pass
            finally:
                probe.close()
        link = registry_link(home)
        staged = link.with_name(f".{link.name}.{os.getpid()}")
        staged.unlink(missing_ok=True)
        staged.symlink_to(path)
        staged.replace(link)  # atomically: a caller sees the old link or this one
    except OSError as exc:
        log.warning("not listed in %s (%s): runs will not find this loader", folder, exc)
        return None
    return link


def _links_to(link: Path, path: Path) -> bool:
    try:
        return Path(os.readlink(link)) == path
    except OSError:
        return False


def _callers_home(request: dict[str, Any]) -> Path | None:
    """The home the caller's command acts on, resolved as the command itself would in the
    caller's environment and working directory (the settings, with its ``--profile`` and
    ``--home``); None when it must not come here (``BULLDOZER_LOADER=off``) or resolving
    fails (the command then runs in the caller and reports the problem itself). The loader
    is single-threaded: the caller's environment stands in for its own for that moment."""
    from bulldozer.settings import load_settings, select_profile

    argv: list[str] = request["argv"]
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        select_profile(option(argv, "--profile"))
        settings = load_settings()
        if settings.loader == "off":
            return None
        return settings.home_path(option(argv[argv.index("run") + 1 :], "--home"), cwd=Path(request["cwd"]))
    except Exception:
        return None
    finally:
        select_profile(None)
        os.environ.clear()
        os.environ.update(saved)


def _start_dal(stack: contextlib.ExitStack, home: Path) -> Any:
    from bulldozer.kv.connect import start_embedded_dal

    dal = stack.enter_context(start_embedded_dal(home))
    dal.wait()
    return dal


def _loop(state: _State, stack: contextlib.ExitStack) -> None:
    while not (state.stopping and not state.children):
        for key, _ in state.selector.select(timeout=1.0):
            if key.data == "accept":
                with contextlib.suppress(BlockingIOError):
                    conn, _ = state.listener.accept()
                    _handle(state, conn, stack)
            elif key.data == "signal":
                with contextlib.suppress(BlockingIOError):
                    state.wake.recv(64)
                _stop(state)
            elif key.data == _SPARE:  # it died waiting (killed): the next command forks its own
                log.warning("the loader's spare child exited before a command came")
                _discard_spare(state)
            else:
                _reap(state, key.data)


def _stop(state: _State) -> None:
    """Take no new commands, and end once the running ones have."""
    if not state.stopping:
        log.info("loader stopping: no new commands; waiting for %d running", len(state.children))
        state.stopping = True
        state.selector.unregister(state.listener)
        _discard_spare(state)


def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def _handle(state: _State, conn: socket.socket, stack: contextlib.ExitStack) -> None:
    """One caller: check who it is, read its request, answer a status or fork its command."""
    conn.setblocking(True)
    conn.settimeout(5.0)
    fds: list[int] = []
    try:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            log.warning("refused a connection from uid %d (pid %d): not this loader's user", uid, pid)
            conn.close()
            return
        body, fds = _message(conn, 3, _MAX_REQUEST)
        if body is None:  # a probe (another loader checking the registry's links)
            conn.close()
            return
        request = json.loads(body)
        _check(request)
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("a request was not understood: %s", exc)
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    if request.get("op") == "status":
        _reply(conn, {"pid": os.getpid(), "home": str(state.home), "running": len(state.children),
                      "served": state.served, "since": state.started, "upgraded": state.code.changed(),
                      "dal": state.dal.address if state.dal is not None else None})  # fmt: skip
        conn.close()
        return
    if not takes(request["argv"]):  # the native caller sends every command (``takes``)
        for fd in fds:
            os.close(fd)
        _reply(conn, {"refused": "not taken"})
        conn.close()
        return
    if state.stopping or len(fds) != 3 or _callers_home(request) != state.home:
        for fd in fds:
            os.close(fd)
        _reply(conn, {"refused": "stopping" if state.stopping else "not this loader's home"})
        conn.close()
        return
    if state.code.changed():  # an upgrade since it started: its children would run old code
        for fd in fds:
            os.close(fd)
        log.warning("the installed code changed since the loader started: it stops, and commands run on their own")
        _reply(conn, {"refused": "upgraded"})
        conn.close()
        _stop(state)
        return
    if state.dal is not None and state.dal.proc.poll() is not None:
        log.warning("the warm embedded DAL exited (code %s); starting another", state.dal.proc.returncode)
        try:
            state.dal = _start_dal(stack, state.home)
        except BackendUnavailableError as exc:
            log.warning("no warm embedded DAL (runs start their own): %s", exc)
            state.dal = None
    spare, state.spare = state.spare, None
    if spare is not None and spare.dal is state.dal and _hand(spare, conn, fds, request, pid):
        child, pidfd = spare.pid, spare.pidfd
        spare.channel.close()
        state.selector.modify(pidfd, selectors.EVENT_READ, child)
    else:
        if spare is not None:
            state.spare = spare
            _discard_spare(state)
        child = os.fork()
        if child == 0:
            _become(state, conn, fds, request, pid)  # never returns
        pidfd = os.pidfd_open(child)
        state.selector.register(pidfd, selectors.EVENT_READ, child)
    for fd in fds:
        os.close(fd)
    state.served += 1
    state.children[child] = _Child(child, conn, pidfd)


def _spawn_spare(state: _State) -> None:
    """Fork the child the next command will get (``_Spare``); none when the machine refuses a
    process or a descriptor now (the next command's child is forked for it, as before)."""
    if state.stopping or state.spare is not None:
        return
    try:
        ours, theirs = socket.socketpair()
    except OSError as exc:
        log.warning("no spare child for the next command: %s", exc)
        return
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        log.warning("no spare child for the next command: %s", exc)
        return
    if pid == 0:
        ours.close()
        _await(state, theirs)  # never returns
    theirs.close()
    pidfd = os.pidfd_open(pid)
    state.spare = _Spare(pid, ours, pidfd, state.dal)
    state.selector.register(pidfd, selectors.EVENT_READ, _SPARE)


def _discard_spare(state: _State) -> None:
    """End the spare, if any, and reap it: it has done nothing a command does yet."""
    spare, state.spare = state.spare, None
    if spare is None:
        return
    spare.channel.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(spare.pid, signal.SIGKILL)
    with contextlib.suppress(KeyError, ValueError):
        state.selector.unregister(spare.pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(spare.pid, 0)
    os.close(spare.pidfd)


def _hand(spare: _Spare, conn: socket.socket, fds: list[int], request: dict[str, Any], caller: int) -> bool:
    """Send the spare its command: the caller's connection and descriptors, then the caller's
    pid and request (``REQUEST_HEADER`` and JSON); False when it is gone (it was killed)
    before it had all of it, and runs nothing. Once the last byte is sent nothing more is:
    the spare may have read it and closed its end already (a send of nothing would then fail,
    and the command, running in the spare, would have been forked a second time)."""
    body = json.dumps({"caller": caller, "request": request}).encode()
    data = REQUEST_HEADER.pack(len(body)) + body
    try:
        sent = socket.send_fds(spare.channel, [data], [conn.fileno(), *fds])
        if sent < len(data):
            spare.channel.sendall(data[sent:])
    except OSError:
        return False
    return True


def _await(state: _State, channel: socket.socket) -> None:
    """In a spare: leave the loader's sockets and its other children's, wait for a command
    (``_hand``) and become it; exit when the channel closes without one (the loader
    discarded it, stopped, or died)."""
    try:
        # a Ctrl-C or a hang-up reaching the loader's group stops the loader, which ends this
        _child_signals(interrupt=signal.SIG_IGN, hang_up=signal.SIG_IGN)
        _leave_loader(state)
        body, fds = _message(channel, 4, 2 * _MAX_REQUEST)
        if body is None or len(fds) != 4:
            os._exit(0)
        channel.close()
        message = json.loads(body)
        conn = socket.socket(fileno=fds[0])
    except BaseException:  # the spare must reach os._exit, whatever happened
        os._exit(0)
    _become(state, conn, fds[1:], message["request"], int(message["caller"]))


def _message(sock: socket.socket, maxfds: int, limit: int) -> tuple[bytes | None, list[int]]:
    """A message on ``sock`` (``REQUEST_HEADER``, then a body of at most ``limit`` bytes) and
    the descriptors that came with its first bytes; None for the body when nothing came.
    ValueError when it is not one (the descriptors closed then)."""
    data, fds, _, _ = socket.recv_fds(sock, 65536, maxfds)
    try:
        if not data:
            if fds:
                raise ValueError("descriptors without a request")
            return None, fds
        if len(data) < REQUEST_HEADER.size:
            raise ValueError("no request")
        (size,) = REQUEST_HEADER.unpack_from(data)
        if size > limit:
            raise ValueError(f"a request of {size} bytes")
        body = bytearray(data[REQUEST_HEADER.size :])
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                raise ValueError("the request was cut short")
            body += chunk
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(body), fds


def _check(request: Any) -> None:
    """A request is a status query, or a command: arguments, working
    directory, environment and umask, each of its type (ValueError otherwise)."""
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    if request.get("op") == "status":
        return
    argv, cwd, env, umask = (request.get(k) for k in ("argv", "cwd", "env", "umask"))
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv is not a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env is not a mapping of strings")
    if not (isinstance(cwd, str) and os.path.isabs(cwd) and isinstance(umask, int)):
        raise ValueError("cwd or umask is missing")


def _reap(state: _State, pid: int) -> None:
    """A child exited: its exit code to its caller (who has it already when the child lived
    to send it itself, see ``_become``)."""
    child = state.children.pop(pid)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _reply(child.conn, {"exit": code if code >= 0 else 128 - code})
    _forget(state, child)
    _spawn_spare(state)  # for the next command: forked now, not while a command runs


def _forget(state: _State, child: _Child) -> None:
    state.selector.unregister(child.pidfd)
    os.close(child.pidfd)
    child.conn.close()


def _become(state: _State, conn: socket.socket, fds: list[int], request: dict[str, Any], caller: int) -> None:
    """In the child: become the caller's command, run it, exit with its code.

    The child tells its caller its pid, then its exit code once its output is flushed: the
    caller is done then, not only when this process has been torn down and the loader has
    reaped it (10-17 ms of a warm run). Both lines come from this one process, in order;
    the loader replies the exit code itself only when the child dies before it could."""
    code = 70  # EX_SOFTWARE, if anything below fails before the command runs
    _reply(conn, {"pid": os.getpid()})
    try:
        _child_signals(interrupt=signal.default_int_handler, hang_up=signal.SIG_DFL)
        _leave_loader(state)
        os.setpgid(0, 0)  # its own group: the caller's signals reach it (and its DAL) alone
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        try:
            os.chdir(request["cwd"])
        except OSError as exc:
            print(f"error: the loader cannot enter the working directory {request['cwd']}: {exc.strerror}",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(code) from None
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["bulldozer", *request["argv"]]
        sys.stdin = open(0, closefd=False, encoding="utf-8", errors="replace")  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False, encoding="utf-8")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        _die_with(caller)
        from bulldozer.cli.common import remake_consoles

        remake_consoles()  # on the caller's terminal, in its environment
        ours = logging.getLogger("bulldozer")  # as a new process has it: the command configures its own
        ours.handlers.clear()
        ours.setLevel(logging.NOTSET)
        ours.propagate = True
        if state.dal is not None:
            from bulldozer.kv.connect import embedded_store_path, use_warm_dal

            use_warm_dal(embedded_store_path(state.home), state.dal.address, state.dal.plane)
        code = _run_cli()  # the preloaded objects stay frozen: collections leave the shared pages alone
    except SystemExit:
        pass  # the one line was said
    except BaseException:  # the child must reach os._exit, whatever happened
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        _reply(conn, {"exit": code & 0xFF})  # what the loader would read from the exit status
        os._exit(code)


def _child_signals(interrupt: Any, hang_up: Any) -> None:
    """In a child: none of the loader's signal handling (its wakeup descriptor, its handlers);
    SIGTERM kills, SIGINT and SIGHUP get these."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGHUP, hang_up)


def _leave_loader(state: _State) -> None:
    """In a child: close what it holds of the loader's (its sockets, its other children's
    connections and pidfds, a spare's channel), once: a spare leaves as it starts, and the
    command it becomes finds nothing more to close."""
    state.selector.close()
    state.listener.close()
    state.wake.close()
    children, state.children = state.children, {}
    for other in children.values():
        other.conn.close()
        os.close(other.pidfd)
    spare, state.spare = state.spare, None
    if spare is not None:
        spare.channel.close()
        os.close(spare.pidfd)
    state.code.close()


def _run_cli() -> int:
    from bulldozer.cli.main import main

    try:
        main()
    except SystemExit as exc:
        from bulldozer.cli.process import exit_status

        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
        return exit_status(exc.code)
    except KeyboardInterrupt as exc:  # before the command's own handler was reached
        from bulldozer.cli.process import interruption

        message, code = interruption(exc)
        print(f"error: {message}", file=sys.stderr)
        return code
    return 0


def _die_with(caller: int) -> None:
    """Kill this command (and its process group: its DAL) when the caller is gone, as the
    one-shot command would be gone with it."""
    try:
        pidfd = os.pidfd_open(caller)
    except ProcessLookupError:
        os.killpg(0, signal.SIGKILL)
        return

    def watch() -> None:
        sel = selectors.DefaultSelector()
        sel.register(pidfd, selectors.EVENT_READ)
        sel.select()
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="caller-watch", daemon=True).start()
