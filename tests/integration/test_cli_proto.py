"""``bulldozer proto`` against a real catalog whose table evolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyiceberg.types import DoubleType, StringType
from typer.testing import CliRunner

from bulldozer.cli.main import app
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import open_catalog
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO

pytestmark = pytest.mark.integration
runner = CliRunner()
TEMPLATE = str(REPO / "templates" / "move_data_to_kv_dal.yaml")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    create_sample_warehouse(tmp_path, rows=100)
    return tmp_path


def test_prints_and_writes_the_schema(home: Path, tmp_path: Path) -> None:
    printed = runner.invoke(app, ["proto", TEMPLATE, "--home", str(home)])
    assert printed.exit_code == 0, printed.output
    assert "message KeyMessage {" in printed.stdout and "optional int64 user_id = 1;" in printed.stdout
    out = tmp_path / "out"
    written = runner.invoke(app, ["proto", TEMPLATE, "--home", str(home), "--out", str(out)])
    assert written.exit_code == 0, written.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "user_item_scores.binpb",
        "user_item_scores.proto",
        "user_item_scores_pb2.py",
        "user_item_scores_pb2.pyi",
    ]


def test_write_puts_the_files_in_the_specs_output_directory(home: Path, tmp_path: Path) -> None:
    """``--write``: into bulldozer_protobuf.output.directory, below the spec's own folder (the
    template's build/proto); a symbolic link that leads out of it is refused."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    spec = jobs / "job.yaml"
    spec.write_text(Path(TEMPLATE).read_text())
    written = runner.invoke(app, ["proto", str(spec), "--home", str(home), "--write"])
    assert written.exit_code == 0, written.output
    assert (jobs / "build" / "proto" / "user_item_scores.proto").is_file()
    both = runner.invoke(app, ["proto", str(spec), "--home", str(home), "--write", "--out", str(tmp_path / "o")])
    assert both.exit_code == 2 and "not both" in both.output
    (tmp_path / "a-file").write_text("")
    into_a_file = runner.invoke(app, ["proto", str(spec), "--home", str(home), "--out", str(tmp_path / "a-file")])
    assert into_a_file.exit_code == 2, into_a_file.output  # mkdir said only "File exists"
    assert f"{tmp_path / 'a-file'} is a file, not a folder to write the schema into" in into_a_file.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (jobs / "build").rename(jobs / "old")
    (jobs / "build").symlink_to(elsewhere)
    refused = runner.invoke(app, ["proto", str(spec), "--home", str(home), "--write"])
    assert refused.exit_code == 2 and "leads out of the spec's folder" in refused.output, refused.output
    assert not any(elsewhere.iterdir())


def test_against_previous_schema_allows_added_column_and_refuses_breaking_change(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "v1"
    assert runner.invoke(app, ["proto", TEMPLATE, "--home", str(home), "--out", str(out)]).exit_code == 0
    previous = out / "user_item_scores.binpb"
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")

    # a value column dropped from the spec is allowed, and reported
    spec = tmp_path / "job.yaml"
    spec.write_text(Path(TEMPLATE).read_text().replace("    - payload\n", ""))
    result = runner.invoke(app, ["proto", str(spec), "--home", str(home), "--against", str(previous), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["compatibility"]
    assert report["breaking"] is False
    assert {
        "path": "ValueMessage.payload",
        "change": "field dropped",
        "verdict": "allowed",
        "detail": "number 11 becomes reserved",
    } in report["differences"]
    assert 'reserved "payload";' in json.loads(result.stdout)["proto"]

    # Iceberg allows float -> double, but the wire changes from fixed32 to fixed64: exit 3
    # (and --against accepts the .proto form too)
    with table.update_schema() as update:
        update.update_column("score", DoubleType())
        update.add_column("extra", StringType())
    result = runner.invoke(
        app,
        ["proto", TEMPLATE, "--home", str(home), "--against", str(out / "user_item_scores.proto")],
    )
    assert result.exit_code == 3, result.output
    assert "refused" in result.stdout and "score" in result.stdout and "float → double" in result.stdout


def test_an_against_file_that_is_no_schema_is_one_line_naming_it(home: Path, tmp_path: Path) -> None:
    """``--against`` a file that does not parse printed protobuf's DecodeError as a traceback;
    one that does not compile was "protoc refused the generated schema", naming a file in a
    scratch folder; one that is no Bulldozer schema raised a ValueError."""
    garbage, broken, foreign = tmp_path / "old.binpb", tmp_path / "old.proto", tmp_path / "other.proto"
    garbage.write_bytes(b"garbage\xff\x01")
    broken.write_text('syntax = "proto3"; message {')
    foreign.write_text('syntax = "proto3";\nmessage A {}\n')
    said = {
        garbage: f"error: --against {garbage}: the previous schema cannot be read: it does not parse as a protobuf "
        "FileDescriptorSet",
        broken: f"error: --against {broken}: protoc refused it: old.proto:1:28: Expected message name.",
        foreign: f"error: --against {foreign}: the previous schema is not a Bulldozer schema: its last file holds "
        "no key and value messages",
    }
    for path, line in said.items():
        result = runner.invoke(app, ["proto", TEMPLATE, "--home", str(home), "--against", str(path)])
        assert result.exit_code == 2 and result.stderr == line + "\n", (path.name, result.output, _opened(home))


def _opened(home: Path) -> dict[str, object]:
    """What a failure of the test above should tell: once (CI, 2026-12-03) the command found
    the home's catalog.db "not a database" on one of its three calls, which no run here
    repeated — the file's size and first bytes then, and this process's descriptors open
    on files in the test's folder."""
    fds = {}
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink()
        except OSError:  # the listing's own descriptor, closed once listed
            continue
        if target.is_relative_to(home):
            fds[fd.name] = str(target)
    try:
        data = (home / "catalog.db").read_bytes()
    except OSError as exc:
        return {"catalog.db": str(exc), "descriptors": fds}
    return {"size": len(data), "head": data[:16], "descriptors": fds}
