"""The job's pyiceberg catalog as Iceberg's Spark runtime opens it
(bulldozer.load.engines.spark.catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulldozer.errors import CatalogError
from bulldozer.load.engines.spark.catalog import spark_catalog_properties


def test_a_sql_catalog_in_a_sqlite_file_is_icebergs_jdbc_catalog_on_that_file(tmp_path: Path) -> None:
    given = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": "file:///w", "s3.region": "x"}
    assert spark_catalog_properties("lake", given) == {
        "type": "jdbc",
        "uri": f"jdbc:sqlite:{tmp_path}/catalog.db",
        "warehouse": "file:///w",
        "io-impl": "org.apache.iceberg.io.ResolvingFileIO",  # Hadoop's file systems have no s3:
        "s3.region": "x",
        "client.region": "x",
    }


@pytest.mark.parametrize(
    ("given", "path_style"),
    [({}, "true"), ({"s3.force-virtual-addressing": "True"}, "false"), ({"s3.path-style-access": "false"}, "false")],
)
def test_an_s3_endpoint_is_addressed_as_pyiceberg_addresses_it(given: dict[str, str], path_style: str) -> None:
    """pyiceberg (pyarrow's S3 client) puts the bucket in the path on an endpoint of the
    operator's unless told otherwise; Iceberg's S3FileIO puts it in the host name."""
    rest = {"type": "rest", "uri": "http://cat", "s3.endpoint": "http://127.0.0.1:9000", **given}
    options = spark_catalog_properties("lake", rest)
    assert options["s3.path-style-access"] == path_style
    assert "io-impl" not in options  # a REST catalog's Java client resolves the FileIO by path already
    assert "s3.path-style-access" not in spark_catalog_properties("lake", {"type": "rest", "uri": "http://cat"})


def test_a_relative_sqlite_path_is_the_file_pyiceberg_opens_from_this_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert spark_catalog_properties("lake", {"uri": "sqlite:///cat.db"})["uri"] == f"jdbc:sqlite:{tmp_path}/cat.db"


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        ({"uri": "https://iceberg.example.com/api"}, "rest"),
        ({"uri": "thrift://metastore:9083"}, "hive"),
        ({"uri": "sqlite:////c.db"}, "jdbc"),
        ({"type": "REST", "uri": "http://x"}, "rest"),
    ],
)
def test_a_catalogs_type_is_written_out_as_pyiceberg_infers_it(given: dict[str, str], kind: str) -> None:
    """Iceberg's Spark catalog takes a catalog without a type for Hive; pyiceberg infers it from the uri."""
    assert spark_catalog_properties("lake", given)["type"] == kind


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            {"type": "sql", "uri": "mssql+pyodbc://bob:s3cret@db/cat"},
            "catalog 'lake' is a SQL catalog on mssql: the Spark engine opens a SQL catalog in a SQLite file or a "
            "PostgreSQL, MySQL or MariaDB database",
        ),
        (
            {"type": "sql", "uri": "mysql+pymysql://bob:s3cret@db/cat?ssl_ca=/ca.pem&charset=latin1"},
            "catalog 'lake' is a SQL catalog on mysql whose uri sets charset, ssl_ca, which the Spark engine's JDBC "
            "driver is not set up to take alike",
        ),
        (
            {"type": "sql", "uri": "mysql+pymysql://bob:s3cret@db/cat?connect_timeout=soon"},
            "catalog 'lake' sets connect_timeout in its uri to a value that is not seconds",
        ),
        (
            {"type": "sql", "uri": "postgresql://bob:s3cret@db/cat?sslcert=/c.pem&target_session_attrs=any"},
            "catalog 'lake' is a SQL catalog on PostgreSQL whose uri sets sslcert, target_session_attrs, which the "
            "Spark engine's JDBC driver is not set up to take alike",
        ),
        (
            {"type": "sql", "uri": "postgresql://bob:s3cret@/cat?host=/run/postgresql"},
            "catalog 'lake' is a SQL catalog on PostgreSQL whose uri sets host",
        ),
        (
            {"type": "sql", "uri": "postgresql://bob:s3cret@/cat"},
            "catalog 'lake' is a SQL catalog on PostgreSQL whose uri names no host (a Unix socket)",
        ),
        ({"type": "sql", "uri": "sqlite://"}, "catalog 'lake' is a SQL catalog in an in-memory or URI-form SQLite"),
        (
            {"type": "sql", "uri": "sqlite:///file:c.db?mode=ro&uri=true"},
            "catalog 'lake' is a SQL catalog in an in-memory or URI-form",
        ),
        ({"type": "glue"}, "catalog 'lake' is of type glue, which the Spark engine does not open (it opens hive, rest"),
        ({"type": "in-memory"}, "catalog 'lake' is of type in-memory, which the Spark engine does not open"),
        ({"py-catalog-impl": "mine.Catalog"}, "catalog 'lake' is a Python catalog (py-catalog-impl)"),
        ({"uri": "mysql://bob:s3cret@db/cat"}, "catalog 'lake' has no type, and its uri does not tell it (http"),
        ({"type": "sql", "uri": "::"}, "catalog 'lake' has a uri that is not a database URL"),
    ],
)
def test_a_catalog_the_spark_engine_cannot_open_is_one_line_saying_what_to_do(given: dict[str, str], said: str) -> None:
    with pytest.raises(CatalogError) as refused:
        spark_catalog_properties("lake", given)
    line = str(refused.value)
    assert line.startswith(said) and "\n" not in line and "s3cret" not in line, line


def test_a_sql_catalog_on_postgresql_is_icebergs_jdbc_catalog_on_that_database() -> None:
    """Host, port and database make the JDBC URL; the user and password (decoded) are
    pgjdbc's properties, never in the URL; libpq's settings are pgjdbc's of the same
    meaning; the catalog timeout bounds connecting and each answer unless the uri sets one."""
    uri = "postgresql+psycopg2://bob:p%40ss%2Fw@db.example.com:6432/ice%20cat?sslmode=verify-full&connect_timeout=7"
    options = spark_catalog_properties("lake", {"type": "sql", "uri": uri, "warehouse": "s3://w"}, 2.5)
    assert options == {
        "type": "jdbc",
        "uri": "jdbc:postgresql://db.example.com:6432/ice%20cat",
        "jdbc.user": "bob",
        "jdbc.password": "p@ss/w",
        "jdbc.sslmode": "verify-full",
        "jdbc.connectTimeout": "7",
        "jdbc.loginTimeout": "3",
        "jdbc.socketTimeout": "3",
        "warehouse": "s3://w",
        "io-impl": "org.apache.iceberg.io.ResolvingFileIO",
    }
    plain = spark_catalog_properties("lake", {"uri": "postgresql://[::1]/cat?application_name=bulldozer"})
    assert plain == {
        "type": "jdbc",
        "uri": "jdbc:postgresql://[::1]:5432/cat",
        "jdbc.ApplicationName": "bulldozer",
        "io-impl": "org.apache.iceberg.io.ResolvingFileIO",
    }


def test_a_sql_catalog_on_mysql_or_mariadb_is_icebergs_jdbc_catalog_through_mariadbs_driver() -> None:
    """PyMySQL connects to localhost over TCP where no host is named, on port 3306; its
    timeouts are seconds, the driver's milliseconds; utf8mb4 is both drivers' default."""
    uri = "mysql+pymysql://bob:p%40ss@db.example.com:3307/ice?charset=utf8mb4&connect_timeout=2.5"
    assert spark_catalog_properties("lake", {"type": "sql", "uri": uri}, 60) == {
        "type": "jdbc",
        "uri": "jdbc:mariadb://db.example.com:3307/ice",
        "jdbc.user": "bob",
        "jdbc.password": "p@ss",
        "jdbc.connectTimeout": "2500",
        "jdbc.socketTimeout": "60000",
        "io-impl": "org.apache.iceberg.io.ResolvingFileIO",
    }
    plain = spark_catalog_properties("lake", {"type": "sql", "uri": "mariadb+pymysql:///cat?read_timeout=9"})
    assert (plain["uri"], plain["jdbc.socketTimeout"]) == ("jdbc:mariadb://localhost:3306/cat", "9000")


def test_aws_credentials_and_region_are_given_as_icebergs_s3fileio_reads_them() -> None:
    """pyiceberg reads ``s3.*`` keys first, then its ``client.*`` keys for every AWS client;
    Iceberg's S3FileIO reads ``s3.*`` credentials and ``client.region``."""
    given = {
        "type": "rest",
        "uri": "http://cat",
        "client.access-key-id": "AK",
        "client.secret-access-key": "SK",
        "s3.session-token": "ST",
        "client.session-token": "other",
        "s3.region": "eu-west-1",
        "client.region": "us-east-1",
    }
    options = spark_catalog_properties("lake", given)
    assert {
        k: options[k] for k in ("s3.access-key-id", "s3.secret-access-key", "s3.session-token", "client.region")
    } == {
        "s3.access-key-id": "AK",
        "s3.secret-access-key": "SK",
        "s3.session-token": "ST",
        "client.region": "eu-west-1",
    }


def test_an_s3_endpoint_without_a_region_is_signed_for_us_east_1_as_pyarrow_signs() -> None:
    """Java's S3 client refused to start without a region, where pyarrow's signs with
    us-east-1; a region the catalog names is kept, and AWS's own S3 (no endpoint) is left
    to Java's region chain."""
    store = {"type": "rest", "uri": "http://cat", "s3.endpoint": "http://127.0.0.1:9000"}
    assert spark_catalog_properties("lake", store)["client.region"] == "us-east-1"
    assert spark_catalog_properties("lake", {**store, "client.region": "eu-west-1"})["client.region"] == "eu-west-1"
    assert "client.region" not in spark_catalog_properties("lake", {"type": "rest", "uri": "http://cat"})


def test_a_rest_or_hive_catalogs_java_client_waits_as_long_as_pyicebergs() -> None:
    """BULLDOZER_CATALOG_TIMEOUT bounds pyiceberg's calls; Iceberg's Java REST client, which
    Spark's reader opens the table with, gets the same bound unless the catalog sets its own,
    and so does the Hive Metastore's client (whole seconds: 600 by default)."""
    options = spark_catalog_properties("lake", {"type": "rest", "uri": "http://cat"}, 2.5)
    assert options["rest.client.connection-timeout-ms"] == options["rest.client.socket-timeout-ms"] == "2500"
    own = {"type": "rest", "uri": "http://cat", "rest.client.socket-timeout-ms": "90000"}
    assert spark_catalog_properties("lake", own, 2.5)["rest.client.socket-timeout-ms"] == "90000"
    assert "rest.client.socket-timeout-ms" not in spark_catalog_properties("lake", {"uri": "sqlite:////c.db"}, 2.5)
    hive = {"type": "hive", "uri": "thrift://metastore:9083"}
    assert spark_catalog_properties("lake", hive, 2.5)["hadoop.hive.metastore.client.socket.timeout"] == "3s"
    assert "hadoop.hive.metastore.client.socket.timeout" not in spark_catalog_properties("lake", hive)
    own_hive = {**hive, "hadoop.hive.metastore.client.socket.timeout": "90s"}
    assert spark_catalog_properties("lake", own_hive, 2.5)["hadoop.hive.metastore.client.socket.timeout"] == "90s"


def test_an_s3_proxy_and_timeouts_are_given_to_icebergs_http_client() -> None:
    """Java ignored pyiceberg's ``s3.proxy-uri`` (Spark's reader went round the operator's
    proxy) and its timeouts."""
    given = {"uri": "http://cat", "s3.proxy-uri": "http://proxy:3128", "s3.connect-timeout": "2.5"}
    options = spark_catalog_properties("lake", {**given, "s3.request-timeout": "30"})
    assert options["http-client.proxy-endpoint"] == "http://proxy:3128"
    assert options["http-client.apache.connection-timeout-ms"] == "2500"
    assert options["http-client.apache.socket-timeout-ms"] == "30000"
    with pytest.raises(CatalogError, match=r"sets s3\.request-timeout to a value that is not seconds"):
        spark_catalog_properties("lake", {**given, "s3.request-timeout": "30s"})


@pytest.mark.parametrize("key", ["s3.role-arn", "client.profile-name", "s3.anonymous", "s3.signer.uri"])
def test_an_s3_setting_java_has_no_key_for_is_refused_not_ignored(key: str) -> None:
    with pytest.raises(CatalogError) as refused:
        spark_catalog_properties("lake", {"uri": "http://cat", key: "true"})
    assert str(refused.value).startswith(f"catalog 'lake' sets {key}: pyiceberg's S3 client ")
    assert str(refused.value).endswith("run the job with the local engine (--engine local)")
    assert spark_catalog_properties("lake", {"uri": "http://cat", "s3.anonymous": "false"})  # off: nothing to do
