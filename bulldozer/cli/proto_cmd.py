"""``bulldozer proto``: print or write the generated schema, and check compatibility."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from bulldozer.cli.common import console, fail, handle_errors, ok, print_json, visible


def _previous_descriptor(path: Path) -> bytes:
    """The schema ``--against`` names, a ``.proto`` compiled or a descriptor set as it is;
    one that does not compile or parse is refused naming the file."""
    from bulldozer.errors import SchemaError
    from bulldozer.schema.compat import check_previous
    from bulldozer.schema.compile import compile_proto

    if not path.exists():
        raise fail(f"{path}: no such file", 2)
    try:
        if path.suffix == ".proto":
            text = path.read_text(encoding="utf-8")
            compiled = compile_proto(text, path.name, python=False, named="it").descriptor_set
        else:
            compiled = path.read_bytes()
        check_previous(compiled)
    except SchemaError as exc:
        raise fail(f"--against {path}: {exc}", 2) from None
    return compiled


def _spec_output(spec: Path, directory: str) -> Path:
    """The spec's output directory, below the spec file's folder: the spec validated it as a
    relative path without '..'; a symbolic link on the way that leads out is refused here."""
    folder = spec.resolve().parent
    out = folder / directory
    if not out.resolve().is_relative_to(folder):
        raise fail(
            f"{spec}: bulldozer_protobuf.output.directory {directory!r} leads out of the spec's folder "
            "(through a symbolic link); write it with --out DIR",
            2,
        )
    return out


@handle_errors
def proto(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    out: Annotated[
        Path | None,
        typer.Option(help="Write NAME.proto, NAME.binpb (FileDescriptorSet), NAME_pb2.py and .pyi here."),
    ] = None,
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Write them into the spec's bulldozer_protobuf.output.directory (relative to the spec's folder).",
        ),
    ] = False,
    against: Annotated[
        Path | None,
        typer.Option(
            help="A previous schema (.binpb descriptor set or .proto): report every "
            "difference; exit 3 if any breaks readers."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON document instead.")] = False,
    home: Annotated[str | None, typer.Option(help="Embedded state folder.", show_default=False)] = None,
) -> None:
    """Generate the KeyMessage / ValueMessage protobuf schema from the spec's table.

    Field numbers are the Iceberg field ids, so renamed and added columns keep old readers
    working; with --against, a change that would break them (or change key bytes) is refused.
    """
    from bulldozer.load.source import source_schema
    from bulldozer.schema.job import build_job_schema, proto_file_name
    from bulldozer.spec.loader import load_spec
    from bulldozer.warehouse.catalog import open_catalog

    if write and out is not None:
        raise fail("give --out DIR or --write (the spec's output.directory), not both", 2)
    loaded = load_spec(spec)
    s = loaded.spec
    if write:
        out = _spec_output(spec, s.bulldozer_protobuf.output.directory)
    schema, source_name = source_schema(loaded, open_catalog(s.data_movement.catalog, home, create=False))
    previous = _previous_descriptor(against) if against else None
    job = build_job_schema(s, schema, source_name, previous)
    written: list[str] = []
    if out is not None:
        if out.exists() and not out.is_dir():  # mkdir said only "File exists"
            raise fail(f"{out} is a file, not a folder to write the schema into", 2)
        out.mkdir(parents=True, exist_ok=True)
        written = [str(p) for p in job.compiled.write(out)]
        binpb = out / proto_file_name(s).replace(".proto", ".binpb")
        binpb.write_bytes(job.descriptor_set)
        written.append(str(binpb))
    if as_json:
        print_json(
            {
                "proto": job.text,
                "files": written,
                "compatibility": job.compat.as_dict() if job.compat else None,
            }
        )
    else:
        if out is None:
            typer.echo(job.text, nl=False)
        else:
            for path in written:
                ok(f"wrote {path}")
        if job.compat is not None:
            _print_report(job.compat)
    if job.compat is not None and job.compat.breaking:
        raise typer.Exit(3)


def _print_report(report: object) -> None:
    from bulldozer.schema.compat import CompatReport

    assert isinstance(report, CompatReport)
    if not report.differences:
        ok("no differences from the previous schema")
        return
    table = Table(title="Compatibility with the previous schema")
    for col in ("field", "change", "verdict", "detail"):
        table.add_column(col)
    for d in report.differences:
        style = "red" if d.verdict == "refused" else "green"
        table.add_row(Text(visible(d.path)), d.change, Text(d.verdict, style=style), Text(visible(d.detail)))
    console.print(table)


@handle_errors
def client(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    out: Annotated[Path, typer.Option(help="Directory to write the package into.")],
    lang: Annotated[str, typer.Option(help="Language: python, java (a Maven project) or go (a Go module).")] = "python",
    home: Annotated[str | None, typer.Option(help="Embedded state folder.", show_default=False)] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(help="Override the spec's endpoint: embedded or HOST:PORT.", show_default=False),
    ] = None,
    schema_generation: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The alias's schema generation the client reads (default: asked from the DAL — the live "
            "version's, or the next one when this schema breaks it).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the files written and the generation as JSON.")
    ] = False,
) -> None:
    """Generate a client library for the job's data, in Python, Java or Go.

    Deterministic (same spec, schema and schema generation, same bytes):

    \b
    python  an installable package: messages, type stubs and a typed reader
            (get / batch_get) that refuses, on connect, a live version it
            would misread;
    java    a Maven project (mvn package): messages, DAL stubs, <Job>Reader
            with a main that reads one key, and a runnable jar (protoc plugin
            fetched from Maven Central);
    go      a Go module (go build, go vet): messages, DAL stubs, client.Reader
            and cmd/read (protoc plugins installed with go install).

    Every reader names the schema generation it was built for, so after a deliberate
    breaking change (run --allow-breaking) its reads are refused instead of misread.
    """
    from bulldozer.codegen.python import generate_python_client
    from bulldozer.load.source import source_schema
    from bulldozer.schema.job import build_job_schema
    from bulldozer.spec.loader import load_spec
    from bulldozer.warehouse.catalog import open_catalog

    if lang not in ("python", "java", "go"):
        raise fail(f"--lang {lang}: choose python, java or go", 2)
    loaded = load_spec(spec)
    s = loaded.spec
    job = build_job_schema(s, *source_schema(loaded, open_catalog(s.data_movement.catalog, home, create=False)))
    generation = schema_generation or _schema_generation(loaded, job.descriptor_set, home, endpoint)
    if lang == "python":
        written = generate_python_client(s, job, out, generation)
    else:
        from bulldozer.codegen.native import generate_go_client, generate_java_client

        written = (generate_java_client if lang == "java" else generate_go_client)(s, job, out, generation)
    if as_json:
        print_json({"lang": lang, "schema_generation": generation, "files": [str(p) for p in written]})
        return
    for path in written:
        ok(f"wrote {path}")
    console.print(f"  schema generation {generation}")


def _schema_generation(loaded: Any, descriptor_set: bytes, home: str | None, endpoint: str | None) -> int:
    """The generation versions with this schema have: the live version's, one more when this
    schema would break its readers, 1 before the first version."""
    from bulldozer.errors import BackendUnavailableError, BulldozerError
    from bulldozer.kv.connect import connect_for_spec
    from bulldozer.schema.compat import check_compatibility
    from bulldozer.versioning.flip import live_version

    try:
        with connect_for_spec(loaded, home, endpoint, create=False) as dal:
            live = live_version(dal, loaded.spec.alias)
    except BackendUnavailableError as exc:
        raise BulldozerError(f"{exc}; pass --schema-generation N to generate the client without the DAL") from None
    if live is None:
        return 1
    breaking = live.value_descriptor_set and check_compatibility(live.value_descriptor_set, descriptor_set).breaking
    return live.schema_generation + 1 if breaking else live.schema_generation
