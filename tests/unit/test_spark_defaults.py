"""The operator's ``spark-defaults.conf`` and the settings Bulldozer gives Spark's driver
(``session.operator_spark_defaults``, ``session.with_operator_defaults``): where both count,
the two values are joined; where Bulldozer sets a setting itself, the file's is named."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bulldozer.errors import LoadError
from bulldozer.load.engines.spark import session


def test_lists_are_joined_and_a_setting_bulldozer_owns_is_named_without_its_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ours = {
        "spark.jars": "/opt/ours.jar",
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.driver.memory": "2g",
        "spark.app.name": "bulldozer",
    }
    theirs = {
        "spark.jars": "/opt/theirs.jar",
        "spark.sql.extensions": "com.example.Extensions",
        "spark.driver.memory": "8g",
        "spark.app.name": "bulldozer",  # the same value: nothing to say
        "spark.eventLog.enabled": "true",  # not Bulldozer's: Spark takes it from the file
    }
    with caplog.at_level(logging.INFO, logger=session.log.name):
        joined = session.with_operator_defaults(ours, theirs)
    assert joined == {
        **ours,
        "spark.jars": "/opt/ours.jar,/opt/theirs.jar",
        "spark.sql.extensions": f"{ours['spark.sql.extensions']},com.example.Extensions",
    }
    (said,) = [r.getMessage() for r in caplog.records if "spark-defaults.conf" in r.getMessage()]
    assert said.endswith("sets itself: spark.driver.memory") and "8g" not in said


def test_a_defaults_file_the_launcher_would_refuse_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dx=\\uZZZZ\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    with pytest.raises(LoadError, match=r"^the operator's Spark defaults .*spark-defaults.conf cannot be read: "):
        session.operator_spark_defaults()
    (tmp_path / "spark-defaults.conf").write_bytes(b"spark.app.name caf\xe9 \n# \xff\n")  # not UTF-8: replaced
    assert session.operator_spark_defaults() == {"spark.app.name": "caf\ufffd"}
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    assert session.operator_spark_defaults() == {}


def test_a_properties_file_pyspark_submit_args_names_replaces_the_defaults_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit reads ``--properties-file`` instead of ``spark-defaults.conf``, or over
    it with ``--load-spark-defaults`` (its settings winning): so does the join."""
    (tmp_path / "spark-defaults.conf").write_text("spark.jars /opt/defaults.jar\nspark.app.name defaults\n")
    (tmp_path / "job.conf").write_text("spark.jars=/opt/named.jar\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--properties-file {tmp_path / 'job.conf'} pyspark-shell")
    assert session.operator_spark_defaults() == {"spark.jars": "/opt/named.jar"}
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS", f"--load-spark-defaults --properties-file={tmp_path / 'job.conf'} pyspark-shell"
    )
    assert session.operator_spark_defaults() == {"spark.jars": "/opt/named.jar", "spark.app.name": "defaults"}
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    assert session.operator_spark_defaults() == {"spark.jars": "/opt/defaults.jar", "spark.app.name": "defaults"}


def test_the_resolved_packages_are_kept_beside_the_operators_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit resolves the packages into spark.jars with the jars given: the
    operator's (from spark-defaults.conf) among them. The packages' files are still kept
    for the next start (``session._remember_jars``), which then neither resolves again nor,
    when local, starts without a class-data archive."""
    monkeypatch.setenv("BULLDOZER_CACHE", str(tmp_path / "cache"))
    ivy = tmp_path / "ivy"
    ivy.mkdir()
    packages = [ivy / "{}_{}-{}.jar".format(*package.split(":")) for package in session.PACKAGES]
    theirs = tmp_path / "operator.jar"
    for jar in [*packages, theirs]:
        jar.write_bytes(b"PK\x05\x06" + bytes(18))
    resolved = [theirs.as_uri(), *(jar.as_uri() for jar in reversed(packages)), session.JAVA_JAR.as_uri()]
    session._remember_jars(",".join(resolved))
    assert session._packages() == {"spark.jars": ",".join(map(str, packages))}
