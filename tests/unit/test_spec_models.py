"""The job spec models, the template and the loader's features."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from bulldozer.errors import SpecError
from bulldozer.spec import JobSpec, load_spec, load_spec_text
from bulldozer.spec.models import parse_duration
from tests.conftest import REPO, SPECS

TEMPLATE = REPO / "templates" / "move_data_to_kv_dal.yaml"
MINIMAL = (SPECS / "good" / "minimal.yaml").read_text()


def test_template_is_valid_and_complete() -> None:
    spec = load_spec(TEMPLATE, env={}).spec
    assert spec.kind == "MoveDataToKvDal"
    assert spec.key_value_dal.endpoint is None  # the operator's: --endpoint, BULLDOZER_ENDPOINT, the profile's
    assert spec.data_movement.key_columns == ("user_id", "item_id", "locale")
    assert spec.key_value_dal.retention.grace_period == timedelta(hours=24)
    assert spec.data_movement.renames == {"rating": "user_rating"}


def test_packaged_template_is_identical_to_the_repository_one() -> None:
    packaged = REPO / "bulldozer" / "templates" / "move_data_to_kv_dal.yaml"
    assert packaged.read_bytes() == TEMPLATE.read_bytes()


def test_installed_template_resource_matches() -> None:
    from bulldozer.cli.spec_cmds import template_text

    assert template_text() == TEMPLATE.read_text(encoding="utf-8")


def test_defaults_of_a_minimal_spec() -> None:
    spec = load_spec_text(MINIMAL).spec
    assert spec.key_value_dal.endpoint is None  # the operator's, else embedded
    assert spec.key_value_dal.write.batch_size == 100_000
    assert spec.key_value_dal.write.max_batch_bytes == 16 * 1024 * 1024
    assert spec.data_movement.duplicate_keys.policy == "fail"
    assert spec.bulldozer_protobuf.key_message == "KeyMessage"
    assert not spec.data_movement.catalog.defined_in_spec  # the operator's catalog of its name, else embedded


def test_models_are_frozen() -> None:
    spec = load_spec_text(MINIMAL).spec
    with pytest.raises(ValidationError):
        spec.key_value_dal.alias = "other"  # type: ignore[misc]


def test_models_forbid_unknown_fields_from_python() -> None:
    data = load_spec_text(MINIMAL).spec.model_dump(by_alias=True)
    data["key_value_dal"]["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        JobSpec.model_validate(data)


def test_env_interpolation() -> None:
    text = MINIMAL.replace(
        "  alias: scores\n",
        "  alias: scores\n  endpoint: ${DAL_HOST}:${DAL_PORT:-7110}\n  token: $${literal}\n",
    )
    spec = load_spec_text(text, env={"DAL_HOST": "dal.internal"}).spec
    assert spec.key_value_dal.endpoint == "dal.internal:7110"
    assert spec.key_value_dal.token == "${literal}"


def test_unset_env_names_the_variable_and_the_line() -> None:
    text = MINIMAL.replace("  alias: scores\n", "  alias: scores\n  token: ${SECRET_TOKEN}\n")
    with pytest.raises(SpecError) as info:
        load_spec_text(text, "job.yaml", env={})
    (issue,) = info.value.issues
    assert (issue.line, issue.path) == (13, "key_value_dal.token")
    assert "SECRET_TOKEN is not set" in issue.message


def test_token_is_not_in_the_repr() -> None:
    text = MINIMAL.replace("  alias: scores\n", "  alias: scores\n  token: s3cr3t\n")
    spec = load_spec_text(text).spec
    assert "s3cr3t" not in repr(spec.key_value_dal)


def test_keep_latest_policy_and_string_shorthand() -> None:
    text = MINIMAL.replace(
        "  value_columns: [rating, price]\n",
        "  value_columns: [rating, price, updated_at]\n  duplicate_keys: {policy: keep_latest, order_by: updated_at}\n",
    )
    assert load_spec_text(text).spec.data_movement.duplicate_keys.order_by == "updated_at"
    text = MINIMAL.replace(
        "  value_columns: [rating, price]\n",
        "  value_columns: [rating, price]\n  duplicate_keys: fail\n",
    )
    assert load_spec_text(text).spec.data_movement.duplicate_keys.policy == "fail"


def test_query_source() -> None:
    text = MINIMAL.replace("    table: sample.user_item_scores\n", "    query: SELECT * FROM sample.user_item_scores\n")
    spec = load_spec_text(text).spec
    assert spec.data_movement.source.query is not None and spec.data_movement.source.table is None


def test_yaml_merge_keys_and_anchors_are_supported() -> None:
    text = MINIMAL.replace(
        "  alias: scores\n",
        "  alias: scores\n  write: &w {batch_size: 500}\n  retention:\n    <<: {keep_versions: 3}\n",
    )
    spec = load_spec_text(text).spec
    assert spec.key_value_dal.write.batch_size == 500
    assert spec.key_value_dal.retention.keep_versions == 3


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("24h", 86400),
        ("7d", 604800),
        ("1w", 604800),
        ("1h30m", 5400),
        (30, 30),
        ("250ms", 0.25),
        ("45", 45),  # a number of seconds, as an environment variable writes it
        ("2.5", 2.5),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(7200, "2h"), (5400, "1h30m"), (90, "1m30s"), (0.25, "250ms"), (90061.5, "1d1h1m1s500ms"), (0, "0s"), (45, "45s")],
)
def test_a_duration_is_said_as_a_spec_writes_it(seconds: float, text: str) -> None:
    from datetime import timedelta

    from bulldozer.spec.models import format_duration

    assert format_duration(timedelta(seconds=seconds)) == text
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["3 days", "h", "", "-5s", "1.5h", True])
def test_bad_durations(text: object) -> None:
    with pytest.raises(Exception, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["367d", "999999999999999s", float("nan"), float("inf"), 1e308])
def test_a_duration_is_at_most_a_year(text: object) -> None:
    """Beyond it a date computed from one overflows: these were an OverflowError traceback."""
    with pytest.raises(Exception, match="a duration is at most 366 days"):
        parse_duration(text)
    assert parse_duration("366d").days == 366
    with pytest.raises(Exception, match="is not a duration"):  # was a ValueError: too many digits for int()
        parse_duration("9" * 5000 + "s")


@pytest.mark.parametrize("schedule", ["@daily", "@hourly", "0 3 * * *", "*/15 * * * 1-5", None])
def test_schedules(schedule: str | None) -> None:
    text = MINIMAL.replace(
        "  owner: data-platform\n",
        "  owner: data-platform\n" + (f'  schedule: "{schedule}"\n' if schedule else ""),
    )
    assert load_spec_text(text).spec.metadata.schedule == schedule


def test_positions_point_at_nested_items(tmp_path: Path) -> None:
    text = MINIMAL.replace("value_columns: [rating, price]", "value_columns:\n    - rating\n    - user_id")
    with pytest.raises(SpecError) as info:
        load_spec_text(text, "x.yaml")
    (issue,) = info.value.issues
    assert (issue.line, issue.column, issue.path) == (12, 7, "data_movement.value_columns[1]")


def test_a_shadow_read_runs_when_asked_or_when_a_gate_needs_one() -> None:
    assert load_spec_text(MINIMAL).spec.key_value_dal.shadow_read_settings is None
    asked = load_spec_text(MINIMAL.replace("  alias: scores\n", "  alias: scores\n  shadow_read: {sample: 200}\n"))
    settings = asked.spec.key_value_dal.shadow_read_settings
    assert settings is not None and (settings.sample, settings.seed, settings.examples) == (200, 0, 3)
    gated = load_spec_text(
        MINIMAL.replace("  alias: scores\n", "  alias: scores\n  quality_gates: {max_added_fraction: 0.1}\n")
    )
    assert gated.spec.key_value_dal.shadow_read_settings is not None  # the defaults


@pytest.mark.parametrize(
    ("package", "fixed"),
    [("com.acme.new.features", "com.acme.new_.features"), ("default", "default_"), ("org.example.int", "org.int_"),
     ("a._", "a.__")],
)  # fmt: skip
def test_a_java_package_with_a_java_keyword_as_a_part_is_refused(package: str, fixed: str) -> None:
    def spec(java_package: str) -> JobSpec:
        return JobSpec.model_validate(
            {
                "apiVersion": "bulldozer/v1",
                "kind": "MoveDataToKvDal",
                "metadata": {"name": "t", "owner": "tests"},
                "data_movement": {"source": {"table": "db.t"}, "key_columns": ["k"]},
                "key_value_dal": {"alias": "t"},
                "bulldozer_protobuf": {"package": "p.t", "output": {"java_package": java_package}},
            }
        )

    with pytest.raises(ValidationError, match=r"has the Java keyword '.*' as a part, which Java cannot compile"):
        spec(package)
    assert spec(fixed).bulldozer_protobuf.output.java_package == fixed
