"""A spec is untrusted input: what reads it never blocks, never reads without bound, never
overflows, and never copies the runner's environment anywhere it was not meant to go."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bulldozer.errors import SpecError
from bulldozer.spec import load_spec, load_spec_text
from tests.conftest import REPO

TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()


def _issues(call: object) -> list[str]:
    with pytest.raises(SpecError) as refused:
        call()  # type: ignore[operator]
    return [str(i) for i in refused.value.issues]


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_without_reading_it(target: str, tmp_path: Path) -> None:
    link = tmp_path / "job.yaml"
    link.symlink_to(target)
    for path in (target, str(link)):
        (line,) = _issues(lambda p=path: load_spec(p))
        assert line == f"{path}: is not a regular file (a device, FIFO or socket); refusing to read it"


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    done: list[list[str]] = []
    reader = threading.Thread(target=lambda: done.append(_issues(lambda: load_spec(fifo))), daemon=True)
    reader.start()
    reader.join(10)
    assert done == [[f"{fifo}: is not a regular file (a device, FIFO or socket); refusing to read it"]]


def test_the_size_limit_holds_while_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: " + b"x" * (2 * 1024 * 1024))
    (line,) = _issues(lambda: load_spec(big))
    assert "the limit is 1048576 bytes" in line


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 600 + "]" * 600,
        "a: " + "{b: " * 600 + "}" * 600,
        "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 600)),
        "a:\n" + "".join("  " * i + "- \n" for i in range(1, 600)),
    ],
    ids=["flow lists", "flow maps", "block maps", "block lists"],
)
def test_deep_nesting_is_one_clear_line(text: str) -> None:
    lines = _issues(lambda: load_spec_text(text, "deep.yaml"))
    assert len(lines) == 1 and "nested deeper than 50 levels" in lines[0] and lines[0].startswith("deep.yaml:")


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("  alias: user_item_scores", "  alias: ${ALIAS}", "key_value_dal.alias"),
        ("  key_columns: [user_id, item_id, locale]", "  key_columns: [user_id, '${COL}', locale]", "key_columns[1]"),
        ("    table: sample.user_item_scores", "    query: SELECT '${SECRET}' AS s", "data_movement.source.query"),
        ("  description: ", "  description: ${SECRET} ", "metadata.description"),
    ],
)
def test_variables_expand_only_where_meant(old: str, new: str, field: str) -> None:
    assert old in TEMPLATE
    text = TEMPLATE.replace(old, new)
    env = {"ALIAS": "x", "COL": "c", "SECRET": "hunter2"}
    lines = _issues(lambda: load_spec_text(text, "job.yaml", env=env))
    assert any(field in line and "${...} is not expanded in this field" in line for line in lines), lines
    assert not any("hunter2" in line for line in lines)


def test_variables_expand_in_endpoint_token_and_catalog_properties() -> None:
    text = (
        TEMPLATE.replace("  alias: user_item_scores", "  alias: user_item_scores\n  token: ${TOKEN}")
        .replace("  # endpoint: dal.example.com:7110", "  endpoint: ${BULLDOZER_ENDPOINT}")
        .replace("    # properties:", "    properties: {uri: '${CATALOG_URI}'}\n    #", 1)
    )
    env = {"TOKEN": "t0ken", "CATALOG_URI": "sqlite:////tmp/c.db", "BULLDOZER_ENDPOINT": "dal:7110"}
    spec = load_spec_text(text, "job.yaml", env=env).spec
    assert spec.key_value_dal.token == "t0ken"
    assert spec.key_value_dal.endpoint == "dal:7110"
    assert spec.data_movement.catalog.properties == {"uri": "sqlite:////tmp/c.db"}


def test_a_literal_dollar_brace_is_fine_anywhere() -> None:
    text = TEMPLATE.replace("  description: ", "  description: costs $${HOME} ")
    assert "${HOME}" in (load_spec_text(text, "job.yaml", env={}).spec.metadata.description or "")


def test_an_expanded_value_is_never_printed_back() -> None:
    text = TEMPLATE.replace("  # endpoint: dal.example.com:7110", "  endpoint: ${DAL}")
    secret = "s3cr3t-value with spaces"
    lines = _issues(lambda: load_spec_text(text, "job.yaml", env={"DAL": secret}))
    assert lines and any("key_value_dal.endpoint" in line for line in lines)
    assert not any("s3cr3t" in line for line in lines), lines
    assert any("${DAL}" in line for line in lines), lines


def test_a_spec_reads_only_the_variables_the_operator_exposes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit ``env``, ``${VAR}`` reads the variables BULLDOZER_SPEC_VARIABLES
    lists (names or patterns), none by default: a spec could otherwise spell any secret of
    the process into the host name it connects to, and hand it to that name's DNS server."""
    monkeypatch.setenv("BULLDOZER_TOKEN", "operatorsecret")
    monkeypatch.setenv("DAL_HOST", "dal.example.com")
    monkeypatch.delenv("BULLDOZER_SPEC_VARIABLES", raising=False)
    leak = TEMPLATE.replace("  # endpoint: dal.example.com:7110", "  endpoint: ${BULLDOZER_TOKEN}.example.com:443")
    lines = _issues(lambda: load_spec_text(leak, "job.yaml"))
    at = next(i for i, line in enumerate(leak.splitlines(), 1) if line.startswith("  endpoint: ${BULLDOZER_TOKEN}"))
    assert lines == [
        f"job.yaml:{at}:13: key_value_dal.endpoint: environment variable BULLDOZER_TOKEN is not one specs may read "
        "(used as ${BULLDOZER_TOKEN}); the operator exposes variables to specs with BULLDOZER_SPEC_VARIABLES"
    ], lines
    defaulted = TEMPLATE.replace("  # endpoint: dal.example.com:7110", "  endpoint: ${DAL_HOST:-localhost}:7110")
    assert any("DAL_HOST is not one specs may read" in line for line in _issues(lambda: load_spec_text(defaulted, "j")))
    monkeypatch.setenv("BULLDOZER_SPEC_VARIABLES", "DAL_*, ICEBERG_URI")
    assert load_spec_text(defaulted, "job.yaml").spec.key_value_dal.endpoint == "dal.example.com:7110"
    assert any("BULLDOZER_TOKEN is not one" in line for line in _issues(lambda: load_spec_text(leak, "job.yaml")))
    monkeypatch.delenv("DAL_HOST")  # exposed but not set: the default
    assert load_spec_text(defaulted, "job.yaml").spec.key_value_dal.endpoint == "localhost:7110"
