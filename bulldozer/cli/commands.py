"""The command line's commands: their names, where each is defined, and which one a command
line names. Light (it imports nothing): the entry point reads it before handing a run over
to a warm loader (bulldozer.cli.loader.client), and the CLI builds from it only the command
it runs (bulldozer.cli.main)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing or collections
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["COMMANDS", "invoked"]

#: name -> (module of bulldozer.cli, attribute): a function is one command, a typer.Typer a
#: group of them; ``bulldozer --help`` lists the commands in this order, then the groups
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("spec_cmds", "validate"),
    "init": ("spec_cmds", "init"),
    "proto": ("proto_cmd", "proto"),
    "client": ("proto_cmd", "client"),
    "run": ("run_cmds", "run"),
    "get": ("run_cmds", "get"),
    "runs": ("run_cmds", "runs"),
    "plan": ("run_cmds", "plan"),
    "serve": ("serve_cmd", "serve"),
    "submit": ("schedule_cmds", "submit"),
    "jobs": ("schedule_cmds", "jobs"),
    "namespaces": ("ops_cmds", "namespaces"),
    "namespace": ("ops_cmds", "namespace_app"),
    "alias": ("ops_cmds", "alias_app"),
    "rollback": ("ops_cmds", "rollback"),
    "pin": ("ops_cmds", "pin"),
    "unpin": ("ops_cmds", "unpin"),
    "gc": ("ops_cmds", "gc"),
    "scan": ("ops_cmds", "scan"),
    "ui": ("ui_cmd", "ui"),
    "warehouse": ("warehouse_cmds", "app"),
    "loader": ("loader_cmds", "app"),
    "spark": ("spark_cmds", "app"),
}


def invoked(argv: Sequence[str]) -> str | None:
    """The command ``argv`` (the arguments after ``bulldozer``) runs, when the only root
    options before it are ``--profile``'s; None for anything else — no command, a name that
    is none, ``--help``, ``--version`` — which the whole command line answers."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--profile":
            i += 2
        elif argv[i].startswith("--profile="):
            i += 1
        else:
            return None
    return argv[i] if i < len(argv) and argv[i] in COMMANDS else None
