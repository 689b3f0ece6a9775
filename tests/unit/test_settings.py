"""The one reader of BULLDOZER_* variables."""

from __future__ import annotations

import re
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


def test_the_dals_a_spec_may_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only DALs the operator configured: embedded, its endpoint, the token's, and the listed."""
    monkeypatch.setenv("BULLDOZER_ENDPOINT", "dal.example:7110")
    monkeypatch.setenv("BULLDOZER_TOKEN_ENDPOINTS", "a:1")
    monkeypatch.delenv("BULLDOZER_SPEC_ENDPOINTS", raising=False)
    names = ("embedded", "dal.example:7110", "a:1", "b.dal.internal:7110", "evil:1", "b.dal.internal:7111")
    assert [load_settings().spec_may_name(e) for e in names] == [True, True, True, False, False, False]
    monkeypatch.setenv("BULLDOZER_SPEC_ENDPOINTS", " *.dal.internal:7110 ,evil:1")
    assert [load_settings().spec_may_name(e) for e in names] == [True, True, True, True, True, False]
    assert not load_settings().token_allowed_for("evil:1")  # a DAL specs may name gets no operator token
    monkeypatch.setenv("BULLDOZER_SPEC_ENDPOINTS", "*")
    assert all(load_settings().spec_may_name(e) for e in names)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("BULLDOZER_TOKEN_ENDPOINTS", "dal.example.com", "'dal.example.com' is not host:port"),
        ("BULLDOZER_TOKEN_ENDPOINTS", "a:1, :::", "':::' is not host:port"),
        ("BULLDOZER_SPEC_ENDPOINTS", "dal.example.com", "'dal.example.com' is not host:port or a pattern of them"),
        ("BULLDOZER_SPEC_ENDPOINTS", "[bad", "'[bad' is not host:port or a pattern of them"),
        ("BULLDOZER_SPEC_VARIABLES", "DAL_HOST DAL_PORT", "'DAL_HOST DAL_PORT' is not a variable name or a pattern"),
        ("BULLDOZER_SPEC_VARIABLES", "DAL-HOST", "'DAL-HOST' is not a variable name or a pattern"),
    ],
)
def test_an_allow_list_entry_that_can_match_nothing_is_refused(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of the operator's allow-lists that could never match (no port, a stray
    bracket, a space where a comma was meant) allowed nothing without a word: the operator
    learned of it only when a spec was refused as if nothing had been listed."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgumentError, match=f"{variable}: {re.escape(said)}"):
        load_settings()


@pytest.mark.parametrize("memory", ["lots", "2 g", "-1g", "2gi", "2gb"])
def test_a_spark_driver_memory_spark_cannot_read_is_refused(memory: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's driver JVM exited at start on such a size, saying only "A fatal exception has
    occurred" (the run: "it exited without saying why", after starting it twice)."""
    monkeypatch.setenv("BULLDOZER_SPARK_DRIVER_MEMORY", memory)
    with pytest.raises(InvalidArgumentError, match="BULLDOZER_SPARK_DRIVER_MEMORY: String should match pattern"):
        load_settings()
    for good in ("2g", "512m", "1024", "4G"):
        monkeypatch.setenv("BULLDOZER_SPARK_DRIVER_MEMORY", good)
        assert load_settings().spark_driver_memory == good


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("soon", "'soon' is not a duration"),
        ("0", "a time limit must be longer than 0 s"),
        ("0s", "a time limit must be longer than 0 s"),
        ("400d", "a duration is at most 366 days"),
        ("-1h", "'-1h' is not a duration"),
    ],
)
def test_a_run_time_limit_is_a_duration_longer_than_nothing(
    value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULLDOZER_RUN_TIMEOUT", value)
    with pytest.raises(InvalidArgumentError, match=f"BULLDOZER_RUN_TIMEOUT: {re.escape(said)}"):
        load_settings()
    for good, seconds in (("2h", 7200), ("90", 90), ("1h30m", 5400), ("2.5", 2.5)):
        monkeypatch.setenv("BULLDOZER_RUN_TIMEOUT", good)
        limit = load_settings().run_timeout
        assert limit is not None and limit.total_seconds() == seconds
    monkeypatch.delenv("BULLDOZER_RUN_TIMEOUT")
    assert load_settings().run_timeout is None


def test_allow_list_entries_in_every_form_they_take(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULLDOZER_TOKEN_ENDPOINTS", "a.b:7110, [::1]:80, 10.0.0.1:1")
    monkeypatch.setenv("BULLDOZER_SPEC_ENDPOINTS", "*.dal.internal:7110, dal-?.x:*, [::1]:7110, *")
    monkeypatch.setenv("BULLDOZER_SPEC_VARIABLES", "DAL_*, ICEBERG_URI, _X?")
    settings = load_settings()
    assert settings.token_allowed_for("[::1]:80") and settings.spec_may_name("dal-3.x:9")


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


def test_a_profile_completes_what_no_variable_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import yaml

    from bulldozer.settings import select_profile

    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        yaml.safe_dump(
            {
                "current": "prod",
                "profiles": {
                    "prod": {"endpoint": "dal.prod:7110", "home": str(tmp_path), "token_file": str(token_file)},
                    "env": {"endpoint": "dal.env:7110", "token_env": "PROD_DAL_TOKEN"},
                },
            }
        )
    )
    for name in ("HOME", "ENDPOINT", "TOKEN", "PROFILE", "TOKEN_ENDPOINTS"):
        monkeypatch.delenv(f"BULLDOZER_{name}", raising=False)
    monkeypatch.setenv("BULLDOZER_PROFILES_FILE", str(profiles))
    select_profile(None)
    settings = load_settings()  # the file's current profile
    assert (settings.dal_endpoint(), settings.home_path(), settings.operator_token()) == (
        "dal.prod:7110",
        tmp_path,
        "from-a-file",
    )
    assert settings.token_allowed_for("dal.prod:7110") and not settings.token_allowed_for("evil:1")
    monkeypatch.setenv("BULLDOZER_PROFILE", "env")
    with pytest.raises(InvalidArgumentError, match="PROD_DAL_TOKEN is not set"):
        load_settings()
    monkeypatch.setenv("PROD_DAL_TOKEN", "t")
    assert load_settings().operator_token() == "t"
    monkeypatch.setenv("BULLDOZER_TOKEN", "variable")
    assert load_settings().operator_token() == "variable"  # a variable wins over the profile
    profiles.write_text("profiles: [not, a, mapping]")
    with pytest.raises(InvalidArgumentError, match="not a valid profiles file"):
        load_settings()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # where, and what; the value never (it said "1 validation error for ProfilesFile" and no more)
        ("profiles:\n  p: {token: s3cr3t}\n", "profiles.p.token: unknown field; a profile says where its token is"),
        ("profiles:\n  p: {endpont: 'dal:1'}\n", "profiles.p.endpont: unknown field; did you mean 'endpoint'?"),
        ("curent: p\n", "curent: unknown field; did you mean 'current'?"),
        ("profiles:\n  p: {endpoint: 5}\n", "profiles.p.endpoint: Input should be a valid string"),
        ("- p\n", "it must be a mapping of 'current' and 'profiles'"),
        ("profiles: {p: [1\n", ":2:1: not a valid profiles file: "),  # YAML: the line and column
        # a profile given twice: YAML kept the second, silently
        (
            "profiles:\n  p: {endpoint: 'a:1'}\n  p: {endpoint: 'b:1'}\n",
            ":3:3: not a valid profiles file: the key 'p' is given twice (while reading a mapping)",
        ),
    ],
)
def test_a_profiles_file_mistake_is_named(
    text: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bulldozer.settings import select_profile

    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(text)
    monkeypatch.setenv("BULLDOZER_PROFILES_FILE", str(profiles))
    monkeypatch.setenv("BULLDOZER_PROFILE", "p")
    select_profile(None)
    with pytest.raises(InvalidArgumentError) as refused:
        load_settings()
    assert said in str(refused.value) and "s3cr3t" not in str(refused.value), str(refused.value)


def test_a_retired_variable_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULLDOZER_ENCODER_KERNELS", "fields")
    with pytest.raises(InvalidArgumentError, match=r"BULLDOZER_ENCODER_KERNELS is no longer read .*compiled"):
        load_settings()
    monkeypatch.setenv("BULLDOZER_ENCODER_KERNELS", "")  # empty is unset
    assert load_settings() is not None


@pytest.mark.parametrize(
    ("name", "said"),
    [
        (
            "BULLDOZER_ENDPIONT",
            "BULLDOZER_ENDPIONT is not a setting Bulldozer reads (did you mean BULLDOZER_ENDPOINT?)",
        ),
        (
            "bulldozer_query_memry",
            "bulldozer_query_memry is not a setting Bulldozer reads (did you mean BULLDOZER_QUERY_MEMORY?)",
        ),
        ("BULLDOZER_WHATEVER", "BULLDOZER_WHATEVER is not a setting Bulldozer reads; unset it"),
    ],
)
def test_a_variable_no_setting_reads_is_refused_not_ignored(
    name: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt BULLDOZER_ENDPOINT left the endpoint unset: a run loaded into the embedded
    store and flipped the alias there, and said it had succeeded."""
    monkeypatch.setenv(name, "dal.example.com:7110")
    with pytest.raises(InvalidArgumentError) as refused:
        load_settings()
    assert str(refused.value).startswith(said) and "dal.example.com" not in str(refused.value)
    monkeypatch.setenv(name, "")  # empty is unset
    assert load_settings() is not None


def test_a_data_file_root_that_is_neither_a_path_nor_a_uri_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lake/legacy`` (an ``s3://`` forgotten) was read as the local ``/lake/legacy``:
    it allowed a folder no one meant, and the bucket stayed refused with no word why."""
    monkeypatch.setenv("BULLDOZER_DATA_FILE_ROOTS", "s3://lake/current/, lake/legacy")
    with pytest.raises(InvalidArgumentError) as refused:
        load_settings()
    assert str(refused.value) == (
        "invalid environment: BULLDOZER_DATA_FILE_ROOTS: 'lake/legacy' is neither an absolute path nor a URI "
        "with its scheme (s3://bucket/prefix)"
    )
    monkeypatch.setenv("BULLDOZER_DATA_FILE_ROOTS", "s3://lake/legacy/, /mnt/hive, file:///srv/x")
    assert load_settings().data_file_roots_listed() == ["s3://lake/legacy/", "/mnt/hive", "file:///srv/x"]
    monkeypatch.setenv("BULLDOZER_DATA_FILE_ROOTS", "*")
    assert load_settings().data_file_roots_listed() == ["*"]


def test_the_projects_own_variables_are_not_settings_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every BULLDOZER_* name the repository spells is a setting, a retired one, one of
    NOT_SETTINGS (the scripts', benchmarks' and tests' own) or a BULLDOZER_TEST_* one, so
    none of them is refused, and NOT_SETTINGS lists no name nothing uses."""
    import re

    from bulldozer.settings import NOT_SETTINGS, RETIRED, Settings
    from tests.conftest import REPO

    fields = {f"BULLDOZER_{name.upper()}" for name in Settings.model_fields}
    spelled: set[str] = set()
    for folder in ("bulldozer", "bench", "scripts", "tests", "dags", "pyspark_bulldozer", ".ci"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".md", ".yaml", ".toml") and path != Path(__file__):
                spelled |= set(re.findall(r"BULLDOZER_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    spelled |= set(re.findall(r"BULLDOZER_[A-Z0-9_]*[A-Z0-9]", (REPO / "README.md").read_text()))
    misspelt = {"BULLDOZER_ENDPIONT"}  # the README's example of what is refused
    others = spelled - fields - set(RETIRED) - set(NOT_SETTINGS) - misspelt
    unaccounted = {n for n in others if not n.startswith("BULLDOZER_TEST")}
    assert unaccounted == set()
    assert set(NOT_SETTINGS) <= spelled
    for name in NOT_SETTINGS:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("BULLDOZER_TEST_ANYTHING", "1")
    assert load_settings() is not None


def test_the_operators_catalogs_from_the_variable_and_the_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import yaml

    from bulldozer.settings import select_profile

    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        yaml.safe_dump(
            {
                "current": "prod",
                "profiles": {"prod": {"catalogs": {"lake": {"type": "rest", "uri": "https://a"}, "b": {"type": "x"}}}},
            }
        )
    )
    for name in ("PROFILE", "CATALOGS", "SPEC_CATALOGS"):
        monkeypatch.delenv(f"BULLDOZER_{name}", raising=False)
    monkeypatch.setenv("BULLDOZER_PROFILES_FILE", str(profiles))
    select_profile(None)
    settings = load_settings()
    assert settings.catalogs == {"lake": {"type": "rest", "uri": "https://a"}, "b": {"type": "x"}}
    assert settings.spec_catalogs == "refuse"
    monkeypatch.setenv("BULLDOZER_CATALOGS", '{"lake": {"type": "sql", "uri": "sqlite:////c.db"}}')
    assert load_settings().catalogs == {"lake": {"type": "sql", "uri": "sqlite:////c.db"}, "b": {"type": "x"}}
    monkeypatch.setenv("BULLDOZER_CATALOGS", '{"lake": {"uri": "sqlite:////s3cret')
    with pytest.raises(InvalidArgumentError) as refused:
        load_settings()
    assert str(refused.value) == "invalid environment: BULLDOZER_CATALOGS: not valid JSON"
    monkeypatch.setenv("BULLDOZER_CATALOGS", '{"lake": {"uri": ["s3cret"]}}')
    with pytest.raises(InvalidArgumentError, match=r"^invalid environment: BULLDOZER_CATALOGS: ") as refused:
        load_settings()
    assert "s3cret" not in str(refused.value)
    # a key given twice: JSON keeps the last, so the first catalog (or property) was lost without a word
    for twice, key in (
        ('{"lake": {"type": "sql", "uri": "sqlite:////s3cret.db"}, "lake": {"type": "sql"}}', "lake"),
        ('{"lake": {"type": "sql", "uri": "sqlite:////s3cret.db", "uri": "sqlite:////b.db"}}', "uri"),
    ):
        monkeypatch.setenv("BULLDOZER_CATALOGS", twice)
        with pytest.raises(InvalidArgumentError) as refused:
            load_settings()
        assert str(refused.value) == f"invalid environment: BULLDOZER_CATALOGS: the key '{key}' is given twice"
