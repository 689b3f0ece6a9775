"""The foundation commands against a real embedded Iceberg catalog (SQLite + local files)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bulldozer import __version__
from bulldozer.cli.main import app
from tests.conftest import REPO, SPECS

pytestmark = pytest.mark.integration
runner = CliRunner()
TEMPLATE = str(REPO / "templates" / "move_data_to_kv_dal.yaml")


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.stdout


@pytest.mark.parametrize("command", [[], ["validate"], ["init"], ["proto"], ["warehouse", "sample"]])
def test_help_explains_each_command(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout and len(result.stdout) > 200


def test_template_validates_against_the_sample_catalog(sample_home: Path) -> None:
    result = runner.invoke(app, ["validate", TEMPLATE, "--catalog", "--home", str(sample_home)])
    assert result.exit_code == 0, result.output
    assert "valid against its catalog" in result.stdout


def test_validate_json_report(sample_home: Path) -> None:
    bad = str(SPECS / "bad" / "alias_traversal.yaml")
    result = runner.invoke(app, ["validate", TEMPLATE, bad, "--json"])
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert [s["valid"] for s in report["specs"]] == [True, False]
    issue = report["specs"][1]["issues"][0]
    assert issue["field"] == "key_value_dal.alias" and issue["line"] == 12


def _spec_with(tmp_path: Path, old: str, new: str) -> str:
    text = (SPECS / "good" / "minimal.yaml").read_text().replace(old, new)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_catalog_check_suggests_near_misses(sample_home: Path, tmp_path: Path) -> None:
    spec = _spec_with(tmp_path, "value_columns: [rating, price]", "value_columns: [ratings, price, nick_name]")
    result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    assert result.exit_code == 2
    assert (
        "job.yaml:10:19: data_movement.value_columns[0]: the table has no column 'ratings'; did you mean 'rating'?"
        in result.stderr
    )
    assert "did you mean 'nickname'?" in result.stderr


def test_a_plain_validate_parses_the_filter(tmp_path: Path) -> None:
    """The filter's grammar needs no catalog: a plain validate refuses one that does not
    parse at its line (it said the spec was valid, and only --catalog or a run refused it)."""
    spec = _spec_with(
        tmp_path, "value_columns: [rating, price]", "value_columns: [rating, price]\n  filter: rating >>> 3"
    )
    result = runner.invoke(app, ["validate", spec])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{spec}:11:3: data_movement.filter: the filter does not parse at character "), line
    fine = _spec_with(
        tmp_path, "value_columns: [rating, price]", "value_columns: [rating, price]\n  filter: rating >= 3"
    )
    assert runner.invoke(app, ["validate", fine]).exit_code == 0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("item_id like 'a%b'", "the filter does not parse: LIKE expressions only supports wildcard, '%', at the end"),
        ("rating > 3 or true", "the filter does not parse: pyiceberg cannot put true or false under OR;"),
        ("not false", "the filter does not parse: pyiceberg cannot put true or false under NOT;"),
        ("rating > 3 and", "the filter does not parse: it ends where more should follow: a filter is pyiceberg's"),
        ("rating > 3 and price <", "the filter does not parse at character 16 ('price <'): a filter is pyiceberg's"),
    ],
)
def test_a_filter_pyicebergs_parser_raises_on_is_one_line(
    sample_home: Path, tmp_path: Path, text: str, said: str
) -> None:
    """pyiceberg's parser raises what its parse actions raise (a ValueError for a LIKE whose
    ``%`` is not at the end, pydantic's ValidationError for a constant under AND, OR or NOT):
    validate, validate --catalog and run printed a traceback. Each is one line at the filter's
    line from those and from plan, and the run loads nothing."""
    spec = _spec_with(tmp_path, "value_columns: [rating, price]", f'value_columns: [rating, price]\n  filter: "{text}"')
    versions = ["namespaces", "scores", "--json", "--home", str(sample_home)]
    before = {v["name"] for v in json.loads(runner.invoke(app, versions).stdout)}
    commands = (["validate", spec], ["validate", spec, "--catalog"], ["run", spec, "-q", "--endpoint", "embedded"])
    for args in (*commands, ["plan", spec]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        assert result.exit_code == 2, (args, result.output)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"{spec}:11:3: data_movement.filter: {said}"), (args, line)
    # the refused run is kept as a FAILED version holding nothing (for ``bulldozer runs``)
    new = [v for v in json.loads(runner.invoke(app, versions).stdout) if v["name"] not in before]
    assert [(v["state"], v["record_count"]) for v in new] == [("FAILED", 0)], new


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # pyiceberg's binder rounds a fraction to the integer column's type, half to even: the
        # run loaded the rows of user_id 1000000 for this filter, which no integer matches
        (
            "user_id = 1000000.5",
            "the filter compares the integer column 'user_id' with 1000000.5, which pyiceberg would round",
        ),
        # and a number in a string it truncates: this one dropped the rows of 1000001
        ("user_id < '1000001.5'", "with '1000001.5', which pyiceberg would round to an integer"),
        ("item_id in (1, 2.5)", None),  # mixed kinds in a list: pyiceberg's grammar refuses it
        ("item_id in (1.5, 2.5)", "the filter compares the integer column 'item_id' with 1.5,"),
        # the binder refused another scale with "Could not convert 1.5 into a decimal(12, 2)"
        ("price > 1.5", "the filter compares the column 'price', a decimal(12, 2), with 1.5: a number compared "),
        ("price > 0.001", "with 0.001: a number compared with it has exactly 2 decimal places (it has more than 2)"),
        # wider than the column: Arrow refused it in the middle of the load
        ("price < 99999999999", "with 99999999999, which has more than its 10 digits before the point"),
        ("price < '99999999999999999999.00'", "which has more than its 10 digits before the point"),
        # a number for a date or a time: pyiceberg counts days or microseconds since 1970, so
        # a date written as 20230101 was in the year 57,000 (no row kept), and seconds since
        # the epoch were 28 minutes after it (every row kept)
        ("signup_date > 20230101", "the filter compares the date column 'signup_date' with the number 20230101: "),
        ("updated_at > 1700000000", "timestamp column 'updated_at' with the number 1700000000: pyiceberg would read"),
        ("event_time > 1700000000", "e.g. '2024-01-31T13:45:00+00:00'"),
        ("signup_date in (19000, 19001)", "the date column 'signup_date' with the number 19000: "),
    ],
)
def test_a_literal_its_column_cannot_hold_as_written_is_refused_up_front(
    sample_home: Path, tmp_path: Path, text: str, said: str | None
) -> None:
    """A literal its column cannot hold as written is one line at the filter from validate
    --catalog, run and plan, before a scan binds it (plan planned the rounded filter and
    said nothing)."""
    spec = _spec_with(tmp_path, "value_columns: [rating, price]", f'value_columns: [rating, price]\n  filter: "{text}"')
    for args in (["validate", spec, "--catalog"], ["run", spec, "-q", "--endpoint", "embedded"], ["plan", spec]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        assert result.exit_code == 2, (args, result.output)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"{spec}:11:3: data_movement.filter: the filter "), (args, line)
        assert said is None or said in line, (args, line)


def test_a_literal_its_column_holds_is_accepted(sample_home: Path, tmp_path: Path) -> None:
    """What the refusals above leave alone: an integral fraction for an integer column, an
    integer or a number of the column's scale for a decimal one, a fraction for a double, and
    dates and times written as strings."""
    for text in (
        "user_id >= 1000005.0",
        "user_id < '1000005'",
        "price > 1.50",
        "price > 2",
        "rating > 1.5",
        "signup_date > '2023-11-15'",
        "updated_at > '2023-11-15T12:00:00'",
        "event_time > '2023-11-15T12:00:00+00:00'",
    ):
        spec = _spec_with(
            tmp_path, "value_columns: [rating, price]", f'value_columns: [rating, price]\n  filter: "{text}"'
        )
        result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
        assert result.exit_code == 0, (text, result.output)


def test_a_run_names_a_missing_column_as_validate_does(sample_home: Path, tmp_path: Path) -> None:
    """A run's schema stage, a plan, ``proto`` and ``client`` report the columns the table
    has not as the spec's own lines, with the closest name (they said ``no such column in
    the table: 'ratings'``, no place)."""
    spec = _spec_with(tmp_path, "value_columns: [rating, price]", "value_columns: [ratings, price]")
    out = str(tmp_path / "out")
    for command in (["run", spec, "-q"], ["plan", spec], ["proto", spec], ["client", spec, "--out", out]):
        result = runner.invoke(app, [*command, "--home", str(sample_home)])
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.strip().splitlines() == [
            f"{spec}:10:19: data_movement.value_columns[0]: the table has no column 'ratings'; did you mean 'rating'?"
        ], command


def test_what_a_command_prints_is_printed_as_written(tmp_path: Path) -> None:
    """A path, a name or a pattern with square brackets in it is printed as it is: rich read
    ``[prod]`` as markup (``✓ [prod].yaml is valid`` came out ``✓ .yaml is valid``, and the
    job name pattern ``^[a-z][a-z0-9_]{0,62}$`` as ``^{0,62}$``)."""
    folder = tmp_path / "team[a]"
    folder.mkdir()
    spec = folder / "[prod].yaml"
    spec.write_text(Path(TEMPLATE).read_text())
    valid = runner.invoke(app, ["validate", str(spec)])
    assert valid.exit_code == 0 and valid.stdout == f"✓ {spec} is valid\n"
    refused = runner.invoke(app, ["init", "Bad[red]Name", "--out", str(tmp_path / "x.yaml")])
    assert refused.exit_code == 2
    assert refused.stderr == "error: job name 'Bad[red]Name' must match ^[a-z][a-z0-9_]{0,62}$\n"


def test_a_home_that_is_not_a_folder_is_one_line(tmp_path: Path) -> None:
    """The operating system's refusal of a file a command needs is one line naming the file
    (it was a traceback ending in ``NotADirectoryError``)."""
    home = tmp_path / "home"
    home.write_text("a file, not a folder")
    for command, needed in (
        (["namespaces"], "kv"),
        (["run", TEMPLATE], "kv"),
        (["validate", TEMPLATE, "--catalog"], "catalog.db"),
    ):
        result = runner.invoke(app, [*command, "--home", str(home)])
        assert result.exit_code == 1, result.output
        assert result.stderr.splitlines()[-1] == f"error: {home}/{needed}: Not a directory", result.stderr
        assert "Traceback" not in result.stderr


def test_an_unknown_stage_is_one_line(sample_home: Path) -> None:
    result = runner.invoke(app, ["run", TEMPLATE, "--stage", "bogus", "--home", str(sample_home)])
    assert result.exit_code != 0
    assert result.stderr == "error: unknown stage 'bogus'; stages: validate, schema, load, verify, flip, retention\n"


def test_catalog_check_missing_table(sample_home: Path, tmp_path: Path) -> None:
    spec = _spec_with(tmp_path, "table: sample.user_item_scores", "table: sample.user_item_score")
    result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    assert result.exit_code == 2
    assert "data_movement.source.table: table 'sample.user_item_score' does not exist" in result.stderr
    assert "sample.user_item_scores" in result.stderr  # the hint lists what exists


def test_catalog_check_bad_filter(sample_home: Path, tmp_path: Path) -> None:
    spec = _spec_with(
        tmp_path,
        "  value_columns: [rating, price]\n",
        "  value_columns: [rating, price]\n  filter: no_such_col > 3\n",
    )
    result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    assert result.exit_code == 2
    assert "data_movement.filter: the filter names 'no_such_col', which is no column of the table\n" in result.stderr
    # the closest column, as for the spec's own columns (pyiceberg's binder said "Could not
    # find field with name ratng, case_sensitive=True"); a nested one by its path
    for named, meant in (("ratng", "rating"), ("USER_ID", "user_id"), ("profile.tiers", "profile.tier")):
        spec = _spec_with(
            tmp_path, "  value_columns: [rating, price]\n", f"  value_columns: [rating, price]\n  filter: {named} > 3\n"
        )
        for args in (["validate", spec, "--catalog"], ["run", spec, "-q", "--endpoint", "embedded"], ["plan", spec]):
            result = runner.invoke(app, [*args, "--home", str(sample_home)])
            assert result.exit_code == 2 and result.stderr.splitlines() == [
                f"{spec}:11:3: data_movement.filter: the filter names {named!r}, which is no column of the table; "
                f"did you mean {meant!r}?"
            ], (args, result.stderr)
    # not pyiceberg's grammar (a function call): one line naming what a filter may say, from
    # validate --catalog and from run, whose schema stage refuses it before anything is loaded
    spec = _spec_with(
        tmp_path,
        "  value_columns: [rating, price]\n",
        "  value_columns: [rating, price]\n  filter: \"item_id = ascii('a')\"\n",
    )
    for args in (["validate", spec, "--catalog"], ["run", spec, "-q", "--endpoint", "embedded"]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        said = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(said) == 1, result.stderr
        assert "data_movement.filter: the filter does not parse at character" in said[0]
        assert "pyiceberg's row-filter grammar" in said[0] and "Expected {" not in said[0]
    # a uuid compared with a literal: pyiceberg's scan cannot evaluate it (Arrow has no kernel),
    # so it is refused up front rather than failing the load; IS NOT NULL on it is fine
    uuid_filter = "  filter: \"user_id > 5 and not (session_id in ('90ea3938-0762-28fa-954e-8a12a98ef7f5'))\"\n"
    spec = _spec_with(
        tmp_path, "  value_columns: [rating, price]\n", "  value_columns: [rating, price]\n" + uuid_filter
    )
    for args in (["validate", spec, "--catalog"], ["run", spec, "-q", "--endpoint", "embedded"]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        said = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(said) == 1, result.stderr
        assert "data_movement.filter: the filter compares the uuid column 'session_id'" in said[0]
    # a list or map column: pyiceberg's scan cannot project one for a filter
    for column, kind in (("recent_orders", "list"), ("attributes", "map")):
        nested = f"  value_columns: [rating, price]\n  filter: {column} is not null\n"
        spec = _spec_with(tmp_path, "  value_columns: [rating, price]\n", nested)
        result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
        assert result.exit_code == 2, result.stderr
        assert (
            f"the filter tests the {kind} column '{column}', which pyiceberg's scan cannot filter on" in result.stderr
        )
    fine = "  filter: session_id is not null\n"
    spec = _spec_with(tmp_path, "  value_columns: [rating, price]\n", "  value_columns: [rating, price]\n" + fine)
    assert runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)]).exit_code == 0


def test_catalog_check_unmappable_key(sample_home: Path, tmp_path: Path) -> None:
    spec = _spec_with(
        tmp_path,
        "key_columns: [user_id, item_id, locale]\n  value_columns: [rating, price]",
        "key_columns: [rating]\n  value_columns: [price]",
    )
    result = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    assert result.exit_code == 2
    assert "key column 'rating' has type double" in result.stderr


def test_init_writes_a_valid_spec(tmp_path: Path, sample_home: Path) -> None:
    out = tmp_path / "clicks.yaml"
    result = runner.invoke(app, ["init", "clicks", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert re.search(r"(?m)^  name: clicks\s", text) and re.search(r"(?m)^  alias: clicks\s", text)
    assert "package: bulldozer.jobs.clicks" in text and "user_item_scores;" not in text
    check = runner.invoke(app, ["validate", str(out), "--catalog", "--home", str(sample_home)])
    assert check.exit_code == 0, check.output
    again = runner.invoke(app, ["init", "clicks", "--out", str(out)])
    assert again.exit_code == 1 and "--force" in again.stderr


def test_init_refuses_a_bad_name(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", "../evil", "--out", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2 and not (tmp_path / "x.yaml").exists()


def test_warehouse_sample_command(tmp_path: Path) -> None:
    home = tmp_path / "h"
    result = runner.invoke(app, ["warehouse", "sample", "--rows", "500", "--home", str(home), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 500 and summary["snapshot_id"]
    assert (home / "catalog.db").exists()


def test_a_run_without_a_terminal_prints_progress_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no progress bar can show (a scheduler's task log), the load's progress is a
    line every PROGRESS_LINE_SECONDS: rows done of the total, the rate and the time left;
    and so is ``namespace verify``'s reading back of a version (a 10 M-row version through
    its layers took 86 s here, and said nothing until it was done)."""
    from bulldozer.cli import progress
    from bulldozer.warehouse.sample import create_sample_warehouse

    home = tmp_path / "home"
    create_sample_warehouse(home, rows=2_000)
    monkeypatch.setattr(progress, "PROGRESS_LINE_SECONDS", 0.0)
    result = runner.invoke(app, ["run", TEMPLATE, "--home", str(home), "--json"])
    assert result.exit_code == 0, result.output
    assert "· load:" not in result.stderr  # --json: no progress
    result = runner.invoke(app, ["run", TEMPLATE, "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert re.search(r"· load: [\d,]+ of 2,000 rows, [\d,]+ rows/s", result.stderr), result.stderr
    verified = runner.invoke(app, ["namespace", "verify", "user_item_scores", "--home", str(home)])
    assert verified.exit_code == 0, verified.output
    version = verified.stdout.split()[1]
    assert re.search(
        rf"^· verify {version}: 2,000 of 2,000 records, [\d,]+ records/s, about 0 s left$", verified.stderr, re.M
    ), verified.stderr
    as_json = runner.invoke(app, ["namespace", "verify", "user_item_scores", "--home", str(home), "--json"])
    assert as_json.exit_code == 0 and "· verify" not in as_json.stderr, as_json.stderr
    monkeypatch.setattr(progress, "PROGRESS_LINE_SECONDS", 3600.0)
    quiet = runner.invoke(app, ["run", TEMPLATE, "--home", str(home)])
    assert quiet.exit_code == 0, quiet.output
    assert "· load:" not in quiet.stderr  # not before an interval has passed
    quiet = runner.invoke(app, ["namespace", "verify", "user_item_scores", "--home", str(home)])
    assert quiet.exit_code == 0 and "· verify" not in quiet.stderr, quiet.stderr


def test_home_for_a_dal_elsewhere_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--home`` names the embedded store; with ``BULLDOZER_ENDPOINT`` (or ``--endpoint``)
    naming a DAL elsewhere, ``get``, ``namespaces``, ``rollback``... ignored it and acted on
    that DAL: ``bulldozer rollback scores --home ./test-store`` would have rolled back the
    operator's live alias. Refused in one line before any connection (nothing listens on the
    port named)."""
    home = str(tmp_path / "h")
    monkeypatch.setenv("BULLDOZER_ENDPOINT", "127.0.0.1:9")
    for command in (["namespaces"], ["get", "scores", "--key", "{}"], ["rollback", "scores", "--yes"], ["gc"]):
        result = runner.invoke(app, [*command, "--home", home])
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr.strip().splitlines() == [
            f"error: --home {home} is the embedded store's folder, but the command acts on the DAL at 127.0.0.1:9 "
            "(BULLDOZER_ENDPOINT or the profile names it): give --endpoint embedded to act on the store under "
            "--home, or leave --home out"
        ], command
    named = runner.invoke(app, ["namespaces", "--home", home, "--endpoint", "127.0.0.1:9"])
    assert named.exit_code == 1 and "(--endpoint 127.0.0.1:9 names it)" in named.stderr
    embedded = runner.invoke(app, ["namespaces", "--home", home, "--endpoint", "embedded", "--json"])
    assert embedded.exit_code == 0 and json.loads(embedded.stdout) == [], embedded.output


def test_a_token_for_the_embedded_store_is_refused(tmp_path: Path) -> None:
    """``get`` and ``ui`` take ``--token`` for a DAL elsewhere; given for the embedded store,
    which takes none, it was sent and taken by nothing, without a word."""
    home = str(tmp_path / "h")
    for command in (["get", "scores", "--key", "{}"], ["ui", "--port", "0"]):
        result = runner.invoke(app, [*command, "--token", "t0k", "--home", home])
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr.strip().splitlines() == [
            "error: --token is for a DAL elsewhere: the embedded store is its owner's alone and takes no token; "
            "give --endpoint HOST:PORT (or BULLDOZER_ENDPOINT), or leave --token out"
        ], command
        assert "t0k" not in result.output


def test_a_branch_or_tag_the_table_lacks_is_one_line_naming_those_it_has(sample_home: Path, tmp_path: Path) -> None:
    """``data_movement.ref`` naming no branch or tag of the table: validate --catalog says so
    at its line, run and plan in one line, each listing the refs the table has; the refused
    run loads nothing."""
    spec = _spec_with(tmp_path, "value_columns: [rating, price]", "value_columns: [rating, price]\n  ref: audit")
    said = "table 'sample.user_item_scores' has no branch or tag 'audit' (it has branches 'main')"
    checked = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    assert checked.exit_code == 2 and checked.stderr.splitlines() == [f"{spec}:11:3: data_movement.ref: {said}"]
    versions = ["namespaces", "scores", "--json", "--home", str(sample_home)]
    before = {v["name"] for v in json.loads(runner.invoke(app, versions).stdout)}
    for args in (["run", spec, "-q", "--endpoint", "embedded"], ["plan", spec]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        assert result.exit_code != 0 and "Traceback" not in result.output, (args, result.output)
        assert result.stderr.splitlines() == [f"error: data_movement.ref: {said}"], (args, result.stderr)
    new = [v for v in json.loads(runner.invoke(app, versions).stdout) if v["name"] not in before]
    assert [(v["state"], v["record_count"]) for v in new] == [("FAILED", 0)], new


def test_a_snapshot_the_table_lacks_is_the_same_line_from_validate_run_and_plan(
    sample_home: Path, tmp_path: Path
) -> None:
    """``data_movement.snapshot_id`` naming no snapshot of the table: validate --catalog said
    only "the table has no snapshot N"; it now says what run and plan say (from the one
    function that resolves a pin), at the field's line."""
    spec = _spec_with(
        tmp_path, "value_columns: [rating, price]", "value_columns: [rating, price]\n  snapshot_id: 12345"
    )
    checked = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(sample_home)])
    (line,) = checked.stderr.splitlines()
    assert checked.exit_code == 2 and line.startswith(f"{spec}:11:3: data_movement.snapshot_id: "), checked.stderr
    said = line.removeprefix(f"{spec}:11:3: ")
    assert said.startswith(
        "data_movement.snapshot_id: table 'sample.user_item_scores' has no snapshot 12345 (it expired, or was never"
    ), said
    for args in (["run", spec, "-q", "--endpoint", "embedded"], ["plan", spec]):
        result = runner.invoke(app, [*args, "--home", str(sample_home)])
        assert result.exit_code != 0 and result.stderr.splitlines() == [f"error: {said}"], (args, result.stderr)


def test_validate_checks_the_columns_of_the_snapshot_a_ref_or_pin_reads(tmp_path: Path) -> None:
    """A column added after the tagged snapshot: validate --catalog took the table's current
    columns and passed a spec whose run then failed; it checks the columns the run reads."""
    from pyiceberg.types import StringType

    from bulldozer.warehouse.sample import create_sample_warehouse

    home = tmp_path / "home"
    table = create_sample_warehouse(home, rows=100)
    first = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(first, "before").commit()
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    columns = "value_columns: [rating, extra]"
    for pin in ("ref: before", f"snapshot_id: {first}"):
        spec = _spec_with(tmp_path, "value_columns: [rating, price]", f"{columns}\n  {pin}")
        said = f"{spec}:10:27: data_movement.value_columns[1]: the table has no column 'extra'"
        checked = runner.invoke(app, ["validate", spec, "--catalog", "--home", str(home)])
        assert checked.exit_code == 2 and checked.stderr.splitlines()[0].startswith(said), checked.stderr
        ran = runner.invoke(app, ["run", spec, "-q", "--endpoint", "embedded", "--home", str(home)])
        assert ran.exit_code == 2 and "'extra'" in ran.stderr, ran.stderr  # as the run refuses it
    current = _spec_with(tmp_path, "value_columns: [rating, price]", columns)
    assert runner.invoke(app, ["validate", current, "--catalog", "--home", str(home)]).exit_code == 0
