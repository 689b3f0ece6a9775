"""``bulldozer loader serve|start|stop|status``: the warm loader (bulldozer.cli.loader)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import HOME_HELP, console, fail, handle_errors, print_json
from bulldozer.settings import python_command

app = typer.Typer(
    help="A warm process that runs `bulldozer run` without its start-up cost.\n\n"
    "For schedulers that run many jobs: while it runs, `bulldozer run` in its home hands itself over "
    "(BULLDOZER_LOADER=off opts out).",
    no_args_is_help=True,
)


def _home(home: str | None) -> Path:
    from bulldozer.settings import load_settings

    return load_settings().home_path(home)


def _own_home(root: Path) -> Path:
    """``root``, when this user may keep a loader there: its embedded store (which the
    loader's warm DAL opens) is not another user's (``kv.privacy``; the loader's folder and
    log said only "Permission denied")."""
    from bulldozer.kv.connect import embedded_store_path
    from bulldozer.kv.privacy import owner_refusal

    if (refused := owner_refusal(embedded_store_path(root))) is not None:
        raise fail(refused)
    return root


@app.command("serve")
@handle_errors
def serve(
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    warm_dal: Annotated[
        bool, typer.Option("--warm-dal/--no-warm-dal", help="Keep an embedded DAL over the home's store running.")
    ] = True,
) -> None:
    """Run the loader in the foreground until SIGTERM, SIGHUP or Ctrl-C (for a supervisor)."""
    from bulldozer.cli import process
    from bulldozer.cli.loader.server import serve as run_loader
    from bulldozer.logs import configure_logging

    configure_logging("info", "text")
    process.collect_again()
    raise typer.Exit(run_loader(_own_home(_home(home)), warm_dal=warm_dal))


@app.command("start")
@handle_errors
def start(
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait until it answers.")] = 60.0,
) -> None:
    """Start the loader in the background and wait until it answers.

    Its log is <home>/logs/loader-DATE.log."""
    from bulldozer.cli.loader import loader_folder
    from bulldozer.cli.loader.client import status

    root = _home(home)
    running = status(root)
    if running is not None and running.get("upgraded"):
        raise fail(
            f"a loader already runs for {root} (pid {running['pid']}) with code older than this installation: "
            "`bulldozer loader stop`, then start it again"
        )
    if running is not None:
        console.print(f"a loader already runs for {root} (pid {running['pid']})")
        return
    _own_home(root)
    from bulldozer.logs import log_file, open_log

    log_path = log_file(root / "logs", "loader")
    loader_folder(root).mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(open_log(log_path), "wb") as log:
        proc = subprocess.Popen(
            python_command("-m", "bulldozer.cli.main", "loader", "serve", "--home", str(root)),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while (answer := status(root)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
            raise fail(f"the loader did not start ({log_path}): {' '.join(tail)}")
        time.sleep(0.05)
    console.print(f"loader running for {root} (pid {answer['pid']}); `bulldozer run` in this home now uses it")


@app.command("status")
@handle_errors
def status_cmd(
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Whether a loader runs for the home: its pid, the commands it ran and runs now.

    Exit code 0 when one runs, 3 when none does (as ``systemctl status``), for scripts.
    """
    from bulldozer.cli.loader.client import status

    root = _home(home)
    answer = status(root)
    if as_json:
        print_json(answer or {"home": str(root), "pid": None})
    elif answer is None:
        console.print(f"no loader runs for {root}")
    else:
        console.print(
            f"loader pid {answer['pid']} for {root}: {answer['served']} command(s) run, {answer['running']} running; "
            f"embedded DAL {answer['dal'] or 'none (runs start their own)'}"
            + ("; it runs code older than this installation (commands run on their own): restart it"
               if answer.get("upgraded") else "")
        )  # fmt: skip
    if answer is None:
        raise typer.Exit(3)


@app.command("stop")
@handle_errors
def stop(
    home: Annotated[str | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait for running commands to finish.")] = 600.0,
) -> None:
    """Stop the loader: it takes no new command, lets the running ones finish, then exits."""
    from bulldozer.cli.loader.client import status

    root = _home(home)
    answer = status(root)
    if answer is None:
        console.print(f"no loader runs for {root}")
        return
    pid = int(answer["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise fail(f"the loader (pid {pid}) still runs after {timeout:.0f} s: its commands have not finished")
        time.sleep(0.05)
    console.print(f"loader stopped (pid {pid})")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
