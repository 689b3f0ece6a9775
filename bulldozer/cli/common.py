"""Shared pieces of the command line: consoles, JSON output, the error boundary and the
client of the store a command acts on (named in its output)."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar, cast

import typer

from bulldozer.cli.process import interruption
from bulldozer.errors import BulldozerError, InvalidArgumentError, SpecError
from bulldozer.redaction import visible

if TYPE_CHECKING:
    from rich.text import Text

    from bulldozer.cli.consoles import OutputConsole
    from bulldozer.kv.client import KvClient

__all__ = [
    "ENDPOINT_HELP",
    "HOME_HELP",
    "Endpoint",
    "Home",
    "Json",
    "Token",
    "console",
    "err_console",
    "error_json",
    "fail",
    "handle_errors",
    "line",
    "made",
    "ok",
    "open_client",
    "open_version",
    "print_json",
    "remake_consoles",
    "report",
    "say_error",
    "say_store",
    "visible",
    "with_store",
]

HOME_HELP = "Embedded state folder (default $BULLDOZER_HOME or ./.bulldozer)."
ENDPOINT_HELP = "embedded or HOST:PORT (default: $BULLDOZER_ENDPOINT, else embedded)."

#: the options every command acting on a DAL shares
Endpoint = Annotated[str | None, typer.Option(help=ENDPOINT_HELP, show_default=False)]
Home = Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)]
Token = Annotated[str | None, typer.Option(help="Bearer token (default: $BULLDOZER_TOKEN).", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


class _Console:
    """A console (``consoles.OutputConsole``) made at its first use — an attribute read or
    set — with the standard streams and environment as they are then, and made again after
    ``forget``. Until a command prints through it, rich stays unimported (bulldozer.cli.consoles)."""

    __slots__ = ("_made", "_stderr")
    _lock = threading.Lock()

    def __init__(self, stderr: bool) -> None:
        object.__setattr__(self, "_stderr", stderr)
        object.__setattr__(self, "_made", None)

    def _console(self) -> OutputConsole:
        it: OutputConsole | None = self._made
        if it is None:
            from bulldozer.cli.consoles import ERR_OPTIONS, OPTIONS, OutputConsole

            with self._lock:  # one console, whichever thread prints first
                it = self._made
                if it is None:
                    it = OutputConsole(**(ERR_OPTIONS if self._stderr else OPTIONS))
                    object.__setattr__(self, "_made", it)
        return it

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._console(), name, value)

    def forget(self) -> None:
        object.__setattr__(self, "_made", None)


_out, _err = _Console(stderr=False), _Console(stderr=True)
#: standard output's and standard error's consoles (rich's, made as a command first prints)
console = cast("OutputConsole", _out)
err_console = cast("OutputConsole", _err)


def made(handle: OutputConsole) -> OutputConsole:
    """The console behind ``console`` or ``err_console`` (made now if it was not yet), for
    a rich object that holds the console it prints through (``Progress(console=...)``):
    the handles pass on attribute reads and writes, not the protocols rich uses on such a
    console (``with console:``)."""
    return cast(_Console, handle)._console()


def remake_consoles() -> None:
    """Make both consoles again, at their next use, for this process's standard streams and
    environment as they are then: a console reads whether its stream is a terminal, and the
    colour variables, when it is made. The warm loader imports the command line once; each
    command it forks has its caller's terminal and environment (bulldozer.cli.loader)."""
    _out.forget()
    _err.forget()


P = ParamSpec("P")
R = TypeVar("R")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def line(*parts: str | tuple[str, str]) -> Text:
    """One line of output from its parts: a text, or a (text, style) pair. Each text is
    printed as written — never read as rich markup (``[prod].yaml`` stayed ``.yaml``) — and
    ``visible`` (a terminal control character in it is shown, not acted on)."""
    from rich.text import Text

    return Text.assemble(*((visible(p), "") if isinstance(p, str) else (visible(p[0]), p[1]) for p in parts))


def ok(message: str) -> None:
    """``✓ MESSAGE`` on standard output: a command did what it was asked."""
    console.print(line(("✓", "green"), " ", message))


def say_error(text: Text | str) -> None:
    """Print a command's error line on stderr, or nothing when stderr cannot take it (the
    terminal hung up: a write fails with EIO), so the command still ends with its own exit
    code (it ended with the write's traceback and 1)."""
    try:
        err_console.print(text)
    except OSError:
        err_console.on_broken_pipe()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: MESSAGE`` on stderr; the exit to raise."""
    say_error(line(("error:", "bold red"), " ", message))
    return typer.Exit(code)


def confirm(question: str) -> None:
    """Ask ``question`` (y/N) where a command changes what readers see or drops data; a no
    ends the command (exit 1), and so does no answer at all (stdin closed: a script that
    meant it passes ``--yes``), each in one line."""
    try:
        if typer.confirm(question):
            return
    except typer.Abort:
        raise fail("not confirmed (no answer on stdin); pass --yes to go ahead without asking") from None
    raise fail("not confirmed: nothing was changed")


def report(exc: BulldozerError) -> typer.Exit:
    """Print ``exc`` as its one line (a spec error: a line per issue) on stderr; the exit to raise."""
    if isinstance(exc, SpecError):
        for said in [str(issue) for issue in exc.issues] or [str(exc)]:
            say_error(visible(said))
        return typer.Exit(exc.exit_code)
    return fail(str(exc), exc.exit_code)


def error_json(exc: BulldozerError) -> dict[str, Any]:
    """What a command asked for JSON prints on stdout when it fails."""
    data: dict[str, Any] = {"error": str(exc), "error_type": type(exc).__name__, "exit_code": exc.exit_code}
    if isinstance(exc, SpecError):
        data["issues"] = [str(issue) for issue in exc.issues]
    return data


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn every Bulldozer error into one clear message and its exit code — never a
    traceback for a user mistake. A command asked for JSON (``--json`` / ``-o json``) also
    prints the failure as a JSON object on stdout."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except BulldozerError as exc:
            if kwargs.get("as_json") is True or str(kwargs.get("output") or "") == "json":
                print_json(error_json(exc))
            raise report(exc) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM or SIGHUP (process.Terminated)
            raise fail(*interruption(exc)) from None
        except BrokenPipeError:
            raise  # the reader went away (``| head``): the process ends quietly (bulldozer.cli.process)
        except OSError as exc:  # the machine refused a file (a home that is not a folder, a full disk)
            raise fail(os_error(exc)) from None

    return wrapper


def os_error(exc: OSError) -> str:
    """An error of the operating system as one line: the file it names and its reason, as
    ``cp`` or ``mkdir`` say it (``/dev/null/logs: Not a directory``)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{exc.filename}: {reason}" if exc.filename is not None else reason


def open_version(client: Any, target: str) -> tuple[str, str, Any, Any, Any]:
    """Resolve ``ALIAS`` or ``ALIAS@VERSION`` (the full name or its short id) to ``(alias,
    version, info, KeyMessage, ValueMessage)``, the classes built from the version's own
    stored descriptor."""
    from bulldozer.schema.compile import load_message_classes

    info = client.describe_target(target)
    key_cls, value_cls = load_message_classes(info.value_descriptor_set, info.key_message, info.value_message)
    return info.alias, info.name, info, key_cls, value_cls


@contextlib.contextmanager
def open_client(
    endpoint: str | None, home: str | None, as_json: bool = False, create: bool = False, **options: Any
) -> Iterator[KvClient]:
    """A client of the DAL the command acts on (``--endpoint`` > ``BULLDOZER_ENDPOINT`` >
    the profile's > embedded), named on stderr for a person (``say_store``) once the command
    succeeded: a refused command prints its one error line and nothing else. A command that
    only reads or changes what exists makes no embedded store where there is none
    (``create``: see ``bulldozer.kv.connect.connect``)."""
    from bulldozer.kv.connect import checked_endpoint, connect
    from bulldozer.settings import load_settings

    target = checked_endpoint(load_settings().dal_endpoint(endpoint))
    if options.get("token") and target == "embedded":  # it would be sent, and taken by nothing
        raise InvalidArgumentError(
            "--token is for a DAL elsewhere: the embedded store is its owner's alone and takes no token; "
            "give --endpoint HOST:PORT (or BULLDOZER_ENDPOINT), or leave --token out"
        )
    if home is not None and target != "embedded":  # --home names the embedded store alone
        named = f"--endpoint {endpoint}" if endpoint else "BULLDOZER_ENDPOINT or the profile"
        raise InvalidArgumentError(
            f"--home {visible(home)} is the embedded store's folder, but the command acts on the DAL at {target} "
            f"({named} names it): give --endpoint embedded to act on the store under --home, or leave --home out"
        )
    with connect(endpoint, home, create=create, **options) as client:
        yield client
        if not as_json:
            say_store(client)


def say_store(client: KvClient) -> None:
    """One dim line on stderr naming the store (stdout stays the command's output)."""
    err_console.print(line((f"store: {client.store}", "dim")))


def with_store(client: KvClient, data: Any) -> Any:
    """``data`` (an object, or a list of them) with the store it came from in each object."""
    if isinstance(data, list):
        return [{**item, "store": client.store} for item in data]
    return {**data, "store": client.store}
