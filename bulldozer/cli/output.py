"""How listing commands print: ``-o table`` (fits the terminal, 80 columns without one:
short version ids, long values cut with "…"), ``wide`` (every column, every value whole),
``json`` (what ``--json`` prints) or ``tsv`` (a header line, then one line per row, whole
values; tabs and newlines inside a value become spaces). A value's control characters are
shown as escapes (``redaction.visible``), never acted on by the terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

import typer

from bulldozer.cli.common import console, print_json, visible
from bulldozer.names import short_version

__all__ = ["Column", "Format", "Output", "emit", "fmt_time", "output_format"]


class Format(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    tsv = "tsv"


Output = Annotated[
    Format | None,
    typer.Option(
        "--output",
        "-o",
        help="table (fits the terminal), wide (whole values), json or tsv.",
        show_default=False,
        case_sensitive=False,
    ),
]


def output_format(output: Format | None, as_json: bool) -> Format:
    """The format a command prints in (``--json`` is ``-o json``)."""
    if as_json and output not in (None, Format.json):
        raise typer.BadParameter(f"--json and -o {output.value} disagree; give one")
    return Format.json if as_json else (output or Format.table)


def fmt_time(value: Any) -> str:
    """A time as ``table`` shows it: ``11-25 17:33`` (UTC; whole in wide, json and tsv)."""
    if isinstance(value, datetime):
        return value.strftime("%m-%d %H:%M")
    return str(value or "")[5:16].replace("T", " ")


def _short(value: Any) -> str:
    return short_version(str(value)) if value else "-"


@dataclass(frozen=True)
class Column:
    """One column: its header, how a row gives its whole value, and how ``table`` shows it."""

    header: str
    value: Callable[[dict[str, Any]], Any]
    #: the value as ``table`` shows it (default: the whole value)
    short: Callable[[Any], str] | None = None
    justify: Literal["left", "right"] = "left"
    #: shown by ``wide`` and ``tsv`` only
    wide_only: bool = False
    #: ``table`` cuts longer values to this many characters, ending them with "…"
    max_width: int | None = None

    @staticmethod
    def version(header: str, key: str) -> Column:
        """A version namespace: its short id in ``table``, its name elsewhere."""
        return Column(header, lambda r: r.get(key) or "", _short)


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[Column], fmt: Format, title: str, data: Any) -> None:
    """Print ``rows`` in ``fmt``; ``json`` prints ``data`` (the command's JSON document)."""
    if fmt is Format.json:
        print_json(data)
        return
    if fmt is Format.tsv:
        out = ["\t".join(c.header for c in columns)]
        for row in rows:
            out.append("\t".join(visible(" ".join(_text(c.value(row)).split())) for c in columns))
        sys.stdout.write("\n".join(out) + "\n")
        return
    if not rows:  # a table of headers only read as if the listing had failed
        console.print(visible(f"{title}: none"))
        return
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from bulldozer.cli.consoles import OutputConsole

    wide = fmt is Format.wide
    shown = [c for c in columns if wide or not c.wide_only]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for c in shown:
        table.add_column(
            c.header,
            justify=c.justify,
            no_wrap=not wide,
            overflow="fold" if wide else "ellipsis",
        )
    for row in rows:
        cells = []
        for c in shown:
            value = c.value(row)
            text = c.short(value) if c.short is not None and not wide else _text(value)
            if not wide and c.max_width and len(text) > c.max_width:
                text = text[: c.max_width - 1] + "…"
            cells.append(Text(visible(text)))  # user data: never read as markup, nor by the terminal
        table.add_row(*cells)
    if wide:  # as wide as its values: never cut, never wrapped by the terminal's width
        OutputConsole(highlight=False, soft_wrap=True, width=100_000).print(table, crop=False)
    else:
        console.print(table)
