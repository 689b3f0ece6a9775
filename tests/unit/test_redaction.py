"""A URL named in a message or a log line never shows its password (bulldozer.redaction)."""

from __future__ import annotations

import pytest

from bulldozer.redaction import shown_url


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
