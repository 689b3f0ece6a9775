"""``bulldozer validate`` and ``bulldozer init``."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from bulldozer.cli.common import err_console, fail, handle_errors, ok, print_json, visible
from bulldozer.errors import SpecError, SpecIssue
from bulldozer.names import ALIAS_PATTERN, is_identifier

TEMPLATE_NAME = "move_data_to_kv_dal.yaml"


def template_text() -> str:
    """The job template shipped inside the package."""
    return (resources.files("bulldozer") / "templates" / TEMPLATE_NAME).read_text(encoding="utf-8")


def _check_one(path: Path, catalog: bool, home: str | None) -> list[SpecIssue]:
    try:
        from bulldozer.spec.loader import load_spec

        loaded = load_spec(path)
    except SpecError as exc:
        return exc.issues
    from bulldozer.spec.checks import spec_issues

    return spec_issues(loaded, catalog, home)


@handle_errors
def validate(
    specs: Annotated[list[Path], typer.Argument(help="Job spec files (YAML).", show_default=False)],
    catalog: Annotated[
        bool,
        typer.Option(
            "--catalog",
            help="Also open the spec's Iceberg catalog and check the table, every named "
            "column (with a 'did you mean'), the filter, and that every type maps to protobuf.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report on stdout.")] = False,
    home: Annotated[
        str | None,
        typer.Option(
            help="Embedded state folder (default $BULLDOZER_HOME or ./.bulldozer).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Validate job specs. Every problem is reported as FILE:LINE:COLUMN: FIELD: MESSAGE.

    Exit code 0 when every spec is valid, 2 when any is not.
    """
    report = []
    bad = 0
    for path in specs:
        issues = _check_one(path, catalog, home)
        bad += bool(issues)
        report.append({"file": str(path), "valid": not issues, "issues": [i.as_dict() for i in issues]})
        if not as_json:
            if issues:
                for issue in issues:
                    err_console.print(visible(str(issue)))
            else:
                ok(f"{path} is valid" + (" against its catalog" if catalog else ""))
    if as_json:
        print_json({"valid": bad == 0, "specs": report})
    if bad:
        raise typer.Exit(2)


def _personalize(text: str, name: str) -> str:
    text = re.sub(r"(?m)^(  name: )user_item_scores", rf"\g<1>{name}", text)
    text = re.sub(r"(?m)^(  alias: )user_item_scores", rf"\g<1>{name}", text)
    text = re.sub(r"(?m)^(  package: bulldozer\.jobs\.)user_item_scores", rf"\g<1>{name}", text)
    text = re.sub(r"(java_package: com\.example\.bulldozer\.)user_item_scores", rf"\g<1>{name}", text)
    return re.sub(
        r"(go_package: example\.com/bulldozer/)user_item_scores;user_item_scores",
        rf"\g<1>{name};{name}",
        text,
    )


@handle_errors
def init(
    name: Annotated[str, typer.Argument(help=f"Job name and alias ({ALIAS_PATTERN}).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where to write (default NAME.yaml).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a new job spec from the packaged, commented template.

    The new spec reads the sample table; edit data_movement to point it at yours.
    """
    if not is_identifier(name):
        raise fail(f"job name {name!r} must match {ALIAS_PATTERN}", 2)
    target = out or Path(f"{name}.yaml")
    if target.exists() and not force:
        raise fail(f"{target} exists; pass --force to overwrite it", 1)
    text = _personalize(template_text(), name)
    from bulldozer.spec.loader import load_spec_text

    load_spec_text(text, str(target), env={})  # the written spec must be valid
    target.write_text(text, encoding="utf-8")
    ok(f"wrote {target}")
