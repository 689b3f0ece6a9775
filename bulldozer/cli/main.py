"""Entry point of the ``bulldozer`` command."""

from __future__ import annotations

from typing import Annotated

from bulldozer.cli import process

process.before_imports()  # before anything imports numpy

import functools  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from typing import Any  # noqa: E402

import typer  # noqa: E402  (after the process tuning above)

from bulldozer._version import __version__  # noqa: E402
from bulldozer.cli.commands import COMMANDS, invoked  # noqa: E402


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bulldozer {__version__}")
        raise typer.Exit()


def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="The named profile (endpoint, TLS files, token source, home) of the profiles file to use "
            "(default: $BULLDOZER_PROFILE, else the file's current one).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Bulldozer: batch data movement from Iceberg to a KV DAL."""
    from bulldozer.settings import select_profile

    select_profile(profile)
    if ctx.invoked_subcommand != "run":
        process.collect_again()  # a run does once it is set up


def build(names: Iterable[str] = COMMANDS) -> typer.Typer:
    """The command line with the commands ``names`` (``COMMANDS``): all of them, or the one a
    process runs — typer makes every registered command's click command before it parses
    (28 of them: 25-30 ms of every command), and importing only the one's module saves more."""
    cli = typer.Typer(
        name="bulldozer",
        help="Move warehouse (Iceberg) tables into an online key-value store as versioned "
        "namespaces, verified, then atomically switched to with an alias.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    cli.callback()(_root)
    for name in names:
        module, attribute = COMMANDS[name]
        target = getattr(importlib.import_module(f"bulldozer.cli.{module}"), attribute)
        if isinstance(target, typer.Typer):
            cli.add_typer(target, name=name)
        else:
            cli.command(name)(target)
    return cli


@functools.cache
def command(name: str | None) -> Callable[..., Any]:
    """The click command ``main`` calls for a command line that names the command ``name``
    (None: all of them), made once per process. Typer makes it from the functions'
    signatures and annotations, 4-5 ms of every command; the warm loader makes the run's
    before it forks, so a run it takes starts with it made (bulldozer.cli.loader)."""
    made: Callable[..., Any] = reflowed(typer.main.get_command(build([name] if name else COMMANDS)))
    return made


def reflowed(command: Any) -> Any:
    """``command`` (a click command or group, and its subcommands) with its help texts as
    written: each paragraph on one line, for the terminal to wrap (typer's rich help prints
    a docstring's line breaks as they are, so at 80 columns a paragraph wrapped at 90 in the
    source came out ragged; one marked ``\\b``, a table or examples, keeps its lines), and
    square brackets escaped, which rich read as markup (``^[a-z][a-z0-9_]{0,62}$`` printed
    as ``^{0,62}$``, ``[default: …]`` not at all)."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = escape(
            "\n\n".join(p.replace("\b\n", "", 1) if p.startswith("\b\n") else " ".join(p.split()) for p in paragraphs)
        )
    for param in command.params:
        if getattr(param, "help", None):
            param.help = escape(param.help)
    for sub in getattr(command, "commands", {}).values():
        reflowed(sub)
    return command


def escape(text: str) -> str:
    """``text`` with what rich reads as a markup tag escaped: ``rich.markup.escape``, which
    imports rich's text and style modules (15-18 ms of every command's start, where a
    command asked for JSON prints nothing through rich). tests/unit/test_cli_commands.py checks
    that both escape every help text of the command line, and the edge cases, alike."""
    import re

    escaped = re.sub(r"(\\*)(\[[a-z#/@][^[]*?])", lambda m: f"{m[1]}{m[1]}\\{m[2]}", text)
    return escaped + "\\" if escaped.endswith("\\") and not escaped.endswith("\\\\") else escaped


def parse_ahead(argv: list[str]) -> None:
    """Make the click command for the command line ``argv`` (``command``) and parse the line
    once, its callbacks not called (a warm loader, before it forks): typer also makes each
    option's converter when it first parses it (a run's first parse 4.2 ms, the next 0.6 ms)."""
    group: Any = command(argv[0])
    parsed = group.make_context("bulldozer", argv, resilient_parsing=True)
    group.get_command(parsed, argv[0]).make_context(argv[0], argv[1:], parent=parsed, resilient_parsing=True)


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole command line (for tests' and tools' use of it as one object)."""
    if name == "app":
        return build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    process.claim()
    try:
        command(invoked(sys.argv[1:]))()
    finally:
        process.exiting()


if __name__ == "__main__":
    main()
