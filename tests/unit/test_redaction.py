"""A URL named in a message or a log line never shows its password (bulldozer.redaction)."""

from __future__ import annotations

import pytest

from bulldozer.redaction import first_line, shown_url, visible, without_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://alice:s3cret@10.0.0.1:6379/0", "redis://alice:***@10.0.0.1:6379/0"),
        ("rediss://:s3cret@[::1]:6380/2", "rediss://:***@[::1]:6380/2"),
        ("unix://u:s3cret@/tmp/redis.sock?db=0", "unix://u:***@/tmp/redis.sock?db=0"),
        ("redis://h:1/0?db=1&password=s3cret&x=1", "redis://h:1/0?db=1&password=***&x=1"),
        (
            "postgresql+psycopg2://bob:s3cret@db/lake?sslmode=require",
            "postgresql+psycopg2://bob:***@db/lake?sslmode=require",
        ),
        ("mysql://db/lake?PWD=s3cret", "mysql://db/lake?PWD=***"),
        ("redis://alice@h:1/0", "redis://alice@h:1/0"),  # no password: as it is
        ("sqlite:////home/me/.bulldozer/catalog.db", "sqlite:////home/me/.bulldozer/catalog.db"),
        ("redis://bob:s3cret@[::1:6379/0", "(a URL that does not parse)"),
    ],
)
def test_a_password_in_a_url_is_not_shown(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    assert "s3cret" not in shown_url(url)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é, 日本, [bold]", "plain text, é, 日本, [bold]"),
        ("red\x1b[31m", "red\\x1b[31m"),  # a colour
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # the window's title
        ("\x1b]52;c;Y2xpcA==\x07", "\\x1b]52;c;Y2xpcA==\\x07"),  # the clipboard
        ("\x9b2J", "\\x9b2J"),  # a C1 control sequence introducer
        ("one\nfake line\r\tx\x7f", "one\\nfake line\\r\\tx\\x7f"),
        ("abc\u202edcba\u2066\u2028", "abc\\u202edcba\\u2066\\u2028"),  # reordered, a new line
    ],
)
def test_a_control_character_is_shown_not_acted_on(text: str, shown: str) -> None:
    assert visible(text) == shown
    assert visible(text).isprintable()


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (ValueError("unable to open database file\n(Background on this error at: https://sqlalche.me/e/21/e3q8)"),
         "unable to open database file"),
        (ValueError("\n  the query does not parse\nLINE 1: SELECT"), "the query does not parse"),
        (RecursionError(), "RecursionError"),  # says nothing: its kind (splitting its text raised IndexError)
        (OSError("  \n "), "OSError"),
    ],
)  # fmt: skip
def test_a_library_s_message_is_its_first_line(exc: BaseException, said: str) -> None:
    assert first_line(exc) == said


def test_a_yaml_error_is_where_and_what_on_one_line() -> None:
    import yaml

    from bulldozer.redaction import yaml_problem, yaml_where

    with pytest.raises(yaml.YAMLError) as marked:
        yaml.safe_load("a: [1,\n")
    assert yaml_where("f.yaml", marked.value) == "f.yaml:2:1"
    assert (
        yaml_problem(marked.value) == "expected the node content, but found '<stream end>' (while parsing a flow node)"
    )
    with pytest.raises(yaml.YAMLError) as unmarked:
        yaml.safe_load("a\x00")
    assert yaml_where("f.yaml", unmarked.value) == "f.yaml"
    assert yaml_problem(unmarked.value) == "unacceptable character #x0000: special characters are not allowed"


def test_a_librarys_message_about_a_client_keeps_none_of_its_secrets() -> None:
    settings = {
        "uri": "mysql://bob:s3cret@db/cat",
        "credential": "client:cl1ent-secret",
        "s3.secret-access-key": "SK-XYZ",
        "s3.access-key-id": "AKID",
        "header.Authorization": "Bearer B-123",
        "adls.account-key": "AK-456",
        "warehouse": "lake",
    }
    said = "no type in mysql://bob:s3cret@db/cat; sent client:cl1ent-secret and SK-XYZ as AKID for lake"
    assert without_secrets(said, settings) == "no type in mysql://bob:***@db/cat; sent *** and *** as AKID for lake"
    assert without_secrets("headers Bearer B-123, key AK-456", settings) == "headers ***, key ***"
