"""The command table (bulldozer.cli.commands): a process builds only the command it runs,
and that command is the one the whole command line has."""

from __future__ import annotations

import itertools

import pytest
import typer

from bulldozer.cli.commands import COMMANDS, invoked
from bulldozer.cli.main import build


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["run", "job.yaml"], "run"),
        (["--profile", "prod", "run", "job.yaml"], "run"),
        (["--profile=prod", "namespace", "list"], "namespace"),
        (["--profile", "run", "gc"], "gc"),  # a profile named like a command is the profile
        ([], None),
        (["--help"], None),
        (["--version", "run"], None),
        (["--bogus", "run"], None),
        (["nonesuch"], None),
        (["--profile"], None),
    ],
)
def test_the_command_a_command_line_names(argv: list[str], name: str | None) -> None:
    assert invoked(argv) == name


def _described(command: typer.core.TyperCommand | typer.core.TyperGroup) -> object:
    """What a click command offers: its parameters (names, types, defaults, help), its help,
    and a group's commands, recursively."""
    params = [(p.name, p.opts, p.secondary_opts, p.required, repr(p.default), getattr(p, "help", None))
              for p in command.params]  # fmt: skip
    subcommands = getattr(command, "commands", {})
    return (command.name, command.help, params, {n: _described(c) for n, c in subcommands.items()})


def test_a_command_built_alone_is_the_whole_command_lines_own() -> None:
    whole = typer.main.get_command(build())
    assert isinstance(whole, typer.core.TyperGroup)
    assert sorted(whole.commands) == sorted(COMMANDS)
    for name in COMMANDS:
        alone = typer.main.get_command(build([name]))
        assert isinstance(alone, typer.core.TyperGroup)
        assert list(alone.commands) == [name]
        assert _described(alone.commands[name]) == _described(whole.commands[name]), name
        assert _described(alone)[2] == _described(whole)[2]  # the root's options


def _commands(command: object, path: str) -> list[tuple[str, object]]:
    found = []
    for name, sub in getattr(command, "commands", {}).items():
        found += [(f"{path} {name}", sub), *_commands(sub, f"{path} {name}")]
    return found


def test_every_command_is_summed_up_in_one_short_sentence() -> None:
    """``bulldozer --help`` (and a group's) lists each command with its help's first
    paragraph as written: a paragraph of several lines came out as a ragged block, and one
    ending in a colon, or with reStructuredText's double backquotes, read as cut off."""
    for path, command in _commands(typer.main.get_command(build()), "bulldozer"):
        summary = (getattr(command, "help", None) or "").split("\n\n")[0].strip()
        assert summary.endswith("."), (path, summary)
        assert "\n" not in summary and "``" not in summary, (path, summary)
        assert len(summary) <= 85, (path, len(summary), summary)


def _description(
    command_line: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The lines of ``bulldozer COMMAND_LINE --help`` at 80 columns before its first panel."""
    from bulldozer.cli.main import command

    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        command(None).main([*command_line, "--help"], prog_name="bulldozer")
    assert exited.value.code == 0
    text = capsys.readouterr().out.split("╭")[0]
    return [line.rstrip() for line in text.splitlines()[3:]]  # after the usage line


@pytest.mark.parametrize(
    "name", [path.removeprefix("bulldozer ") for path, _ in _commands(typer.main.get_command(build()), "bulldozer")]
)
def test_a_commands_help_fills_the_terminals_width(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A help paragraph is wrapped to the terminal, not to the docstring's lines: typer's
    help printed a docstring's line breaks as written, so at 80 columns a paragraph wrapped
    at 90 in the source came out with a word or two alone on every other line."""
    lines = _description(name.split(), capsys, monkeypatch)
    for line, after in itertools.pairwise(lines):
        # a line followed by more of its paragraph (not a table's next row or an example)
        if line and after and not after.startswith("  ") and not line.endswith((";", ":")):
            assert len(line) + 1 + len(after.split()[0]) > 78, (name, line, after)


def test_a_table_in_a_help_text_keeps_its_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _description(["client"], capsys, monkeypatch)
    assert " python  an installable package: messages, type stubs and a typed reader" in lines
    assert "         (get / batch_get) that refuses, on connect, a live version it" in lines


def _help(command_line: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``bulldozer COMMAND_LINE --help`` as printed, its lines joined (the panels wrap)."""
    from bulldozer.cli.main import command

    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        command(None).main([*command_line, "--help"], prog_name="bulldozer")
    return " ".join(capsys.readouterr().out.split())


def test_square_brackets_in_a_help_text_are_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rich read them as markup: the name pattern printed as ``^{0,62}$``, and the data
    plane's ``[default: …]`` not at all."""
    assert "Job name and alias (^[a-z][a-z0-9_]{0,62}$)." in _help(["init"], capsys, monkeypatch)
    assert "[default: $BULLDOZER_DATA_PLANE, else auto] Who answers" in _help(["serve"], capsys, monkeypatch)


def _help_texts() -> list[str]:
    """Every help text of the command line as written: each command's and each option's."""
    texts = []
    for _, command in _commands(typer.main.get_command(build()), "bulldozer"):
        texts += [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    return [t for t in texts if t]


@pytest.mark.parametrize(
    "text",
    [
        "[bold]x[/bold]",
        "a [default: 1] b [x] c",
        r"\[not a tag]",
        r"\\[a tag after two backslashes]",
        "[#ff0000]red[/] [@click]link[/]",
        "[A capital is no tag] [1] [] [",
        "ends with one backslash \\",
        "ends with two backslashes \\\\",
        "nested [a [b] c]",
        "",
    ],
)
def test_edge_cases_are_escaped_as_rich_escapes_them(text: str) -> None:
    """``bulldozer.cli.main.escape`` keeps rich out of a command's start; rich's own escape
    is the rule it must follow."""
    from rich.markup import escape as richs

    from bulldozer.cli.main import escape

    assert escape(text) == richs(text)


def test_every_help_text_is_escaped_as_rich_escapes_it() -> None:
    """The command line's own help texts, some with brackets in them, escaped alike."""
    from rich.markup import escape as richs

    from bulldozer.cli.main import escape

    texts = _help_texts()
    assert any("[" in t for t in texts)
    for t in texts:
        assert escape(t) == richs(t), t
