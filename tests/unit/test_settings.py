"""The one reader of BULLDOZER_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulldozer.errors import InvalidArgumentError
from bulldozer.settings import load_settings


def test_variables_are_typed_fields(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BULLDOZER_HOME", str(tmp_path))
    monkeypatch.setenv("BULLDOZER_ENDPOINT", "dal.example:7110")
    monkeypatch.setenv("BULLDOZER_TOKEN", "s3cret")
    monkeypatch.setenv("BULLDOZER_TOKEN_ENDPOINTS", "a:1, b:2")
    monkeypatch.setenv("BULLDOZER_DAGS_STRICT", "1")
    monkeypatch.setenv("BULLDOZER_SPARK_MASTER", "spark://m:7077")
    settings = load_settings()
    assert settings.home_path() == tmp_path and settings.home_path("x") == Path("x").absolute()
    assert settings.dal_endpoint() == "dal.example:7110" and settings.dal_endpoint("other:1") == "other:1"
    assert settings.operator_token() == "s3cret" and "s3cret" not in repr(settings)
    assert [settings.token_allowed_for(e) for e in ("a:1", "b:2", "dal.example:7110", "embedded", "evil:1")] == [
        True,
        True,
        True,
        True,
        False,
    ]
    assert settings.dags_strict and settings.spark_master == "spark://m:7077"
    assert settings.specs_folder() == tmp_path / "specs"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOME", "ENDPOINT", "TOKEN", "TOKEN_ENDPOINTS", "DATA_PLANE", "TLS_CA", "TLS_CERT"):
        monkeypatch.delenv(f"BULLDOZER_{name}", raising=False)
    settings = load_settings()
    assert settings.dal_endpoint() == "embedded" and settings.operator_token() is None
    assert settings.data_plane == "auto" and settings.tls_files() is None
    assert settings.home_path() == Path(".bulldozer").absolute()


def test_a_malformed_variable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULLDOZER_DATA_PLANE", "warp")
    with pytest.raises(InvalidArgumentError, match="BULLDOZER_DATA_PLANE") as refused:
        load_settings()
    assert "\n" not in str(refused.value)
