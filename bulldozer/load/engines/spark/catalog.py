"""The job's catalog as Iceberg's Spark runtime opens it.

Bulldozer's catalogs are pyiceberg catalogs (the operator's ``BULLDOZER_CATALOGS``, or the
embedded SQL catalog in a SQLite file); the Spark engine opens the same catalog in Spark's
JVM (``spark.sql.catalog.<name>.*``) for the tables it reads by key through Iceberg's Spark
reader. Where the two spell a catalog differently, this module translates:

- pyiceberg's SQL catalog (``type: sql``, a SQLAlchemy URL) is Iceberg's JDBC catalog on
  the same database (``type=jdbc``, a JDBC URL): both keep their tables in the same
  ``iceberg_tables`` rows, keyed by the catalog's name. The driver is given the JDBC
  drivers of SQLite, PostgreSQL and MariaDB (which speaks to MySQL too): a SQLite file is
  named by its absolute path; a PostgreSQL or MySQL URL's host, port and database make the
  JDBC URL, its user and password Iceberg's ``jdbc.user`` and ``jdbc.password`` (never
  part of the URL), and the settings its query may hold are the JDBC driver's of the same
  meaning (``_PG_SETTINGS``, ``_MYSQL_SETTINGS``); another one, or a SQL catalog on
  another database, is refused here, in one line, rather than connected otherwise than
  pyiceberg connects.
- pyiceberg infers a catalog's type from its ``uri`` when ``type`` is absent (``http…`` is
  REST, ``thrift…`` Hive); Iceberg's Spark catalog takes Hive then. The type is written out.
- pyiceberg's FileIO reads S3 paths with its own client, Iceberg's Java catalogs of the JDBC
  and Hive types with Hadoop's file systems (which have no ``s3:``): those get Iceberg's
  ``ResolvingFileIO`` (``S3FileIO`` for S3 paths, from the AWS bundle the driver is given;
  Hadoop's for the others), as a REST catalog has by default. pyiceberg's ``s3.region`` is
  Java's ``client.region`` (us-east-1 for an ``s3.endpoint`` of the operator's without one,
  as pyarrow signs), its ``client.*`` credentials (for every AWS client) Java's
  ``s3.*`` ones, its proxy and timeouts (seconds) Java's HTTP client's (milliseconds), and
  pyiceberg addresses a bucket by path on an ``s3.endpoint`` of the operator's (Java by
  host, unless ``s3.path-style-access``). An S3 setting Java has no key of the same
  meaning for here (an assumed role, a profile, anonymous reads, a remote signer) is
  refused on the Spark engine: ignored, Spark's reader would read otherwise than pyiceberg.
- A catalog type Iceberg's Spark runtime here cannot open (Glue and DynamoDB need the AWS
  SDK's jars, BigQuery its own; in-memory and ``py-catalog-impl`` catalogs exist in this
  Python process only) is refused in one line, before the run writes anything, instead of
  failing the load with a Java exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bulldozer.errors import CatalogError
from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse import catalog_tls

__all__ = ["SPARK_CATALOG_TYPES", "refuse_unopenable", "spark_catalog_properties"]

#: pyiceberg's catalog types the Spark engine opens, and Iceberg's Java name for each
SPARK_CATALOG_TYPES = {"rest": "rest", "hive": "hive", "sql": "jdbc"}
#: pyiceberg's keys of every AWS client's credentials, and the S3FileIO keys Iceberg's Java reads them from
_S3_CREDENTIALS = {
    "client.access-key-id": "s3.access-key-id",
    "client.secret-access-key": "s3.secret-access-key",
    "client.session-token": "s3.session-token",
}
#: pyiceberg's S3 client timeouts (seconds), and Iceberg's Java HTTP client's (milliseconds)
_S3_TIMEOUTS = {
    "s3.connect-timeout": "http-client.apache.connection-timeout-ms",
    "s3.request-timeout": "http-client.apache.socket-timeout-ms",
}
#: pyiceberg's S3 settings Iceberg's Java S3 client has no key of the same meaning for here
#: (each needs a client factory or a signer of its own): refused on the Spark engine rather
#: than read otherwise than the local engine would (what pyiceberg's client then does)
_S3_UNTRANSLATED = {
    "s3.role-arn": "assumes a role",
    "client.role-arn": "assumes a role",
    "s3.profile-name": "reads its credentials from a profile",
    "client.profile-name": "reads its credentials from a profile",
    "s3.anonymous": "reads anonymously",
    "s3.signer": "has its requests signed remotely",
    "s3.signer.uri": "has its requests signed remotely",
    "s3.signer.endpoint": "has its requests signed remotely",
}
#: the region pyarrow's S3 client signs with where nothing names one
DEFAULT_S3_REGION = "us-east-1"
#: the Hive Metastore client's wait for each answer, as Iceberg's Hive catalog in Spark is given it
_HIVE_SOCKET_TIMEOUT = "hadoop.hive.metastore.client.socket.timeout"
#: Bulldozer's Java classes for the driver (``native/java``, built by ``scripts/build_java.sh``)
JAVA_JAR = Path(__file__).resolve().parents[4] / "native" / "bin" / "bulldozer-iceberg.jar"
#: Iceberg's REST client's TLS configurer, and Bulldozer's, which reads ``catalog_tls.SETTINGS``
_TLS_CONFIGURER = "rest.client.tls.configurer-impl"
PEM_TLS_CONFIGURER = "bulldozer.iceberg.PemTlsConfigurer"
#: Iceberg's FileIO that picks a file system by a path's scheme (S3FileIO for ``s3:``)
RESOLVING_FILE_IO = "org.apache.iceberg.io.ResolvingFileIO"


def spark_catalog_properties(name: str, properties: Mapping[str, str], timeout: float | None = None) -> dict[str, str]:
    """Iceberg's Java catalog properties (``spark.sql.catalog.<name>.*`` without the
    prefix) for the pyiceberg catalog ``name`` with ``properties``; a CatalogError, in one
    line, for a catalog the Spark engine cannot open. ``timeout`` (seconds: the operator's
    ``BULLDOZER_CATALOG_TIMEOUT``) bounds each call of a REST catalog's Java client as it
    bounds pyiceberg's, and each answer of a Hive Metastore, unless the catalog sets Java's
    own timeouts."""
    if "py-catalog-impl" in properties:
        raise CatalogError(
            f"catalog {name!r} is a Python catalog (py-catalog-impl), which Spark's JVM cannot open: "
            "run the job with the local engine (--engine local)"
        )
    kind = _catalog_type(name, properties)
    java = SPARK_CATALOG_TYPES.get(kind)
    if java is None:
        opens = ", ".join(sorted(SPARK_CATALOG_TYPES))
        raise CatalogError(
            f"catalog {name!r} is of type {kind}, which the Spark engine does not open (it opens {opens}: "
            "Iceberg's Spark runtime here has no other catalog's client): run the job with the local engine "
            "(--engine local), or serve the catalog over REST"
        )
    options = {k: v for k, v in properties.items() if k != "type"}
    options["type"] = java
    if kind == "sql":
        options.update(_jdbc(name, properties.get("uri", ""), timeout))
    if kind in ("sql", "hive"):
        options.setdefault("io-impl", RESOLVING_FILE_IO)
    catalog_tls.check(name, kind, properties)
    if kind == "rest" and catalog_tls.tls_settings(properties):
        options.update(_java_tls(name, properties))
    if kind == "rest" and timeout is not None:
        for key in ("rest.client.connection-timeout-ms", "rest.client.socket-timeout-ms"):
            options.setdefault(key, str(max(1, round(timeout * 1000))))
    if kind == "hive" and timeout is not None:
        # the Hive client's Hadoop settings (Iceberg's catalog takes ``hadoop.*`` as its
        # configuration's); Hive's default waits 600 s for each answer of the metastore
        options.setdefault(_HIVE_SOCKET_TIMEOUT, f"{max(1, math.ceil(timeout))}s")
    options.update(_java_s3(name, properties))
    return options


def _java_tls(name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Iceberg's REST client's setting for the catalog's TLS settings (``catalog_tls``):
    Bulldozer's configurer, which reads them from the catalog's properties; a CatalogError
    where Java cannot apply them as pyiceberg does."""
    if properties.get(_TLS_CONFIGURER, PEM_TLS_CONFIGURER) != PEM_TLS_CONFIGURER:
        raise CatalogError(
            f"catalog {name!r} sets both {_TLS_CONFIGURER} and {', '.join(catalog_tls.tls_settings(properties))}, "
            "which its configurer would not read: give one or the other"
        )
    if not JAVA_JAR.is_file():
        raise CatalogError(
            f"catalog {name!r} has TLS settings, which Iceberg's Java REST client takes through Bulldozer's Java "
            "classes, and they are not built here (scripts/bootstrap.sh builds them where a Java JDK is installed): "
            "run the job with the local engine (--engine local)"
        )
    key = properties.get(catalog_tls.CLIENT_KEY) or properties.get(catalog_tls.CLIENT_CERT)
    if key is not None:
        try:
            pkcs8 = "-----BEGIN PRIVATE KEY-----" in Path(key).read_text(errors="replace")
        except OSError as exc:
            raise CatalogError(f"catalog {name!r}: cannot read its private key {key!r} ({exc.strerror})") from None
        if not pkcs8:
            raise CatalogError(
                f"catalog {name!r}: its private key {key!r} is not in PKCS #8 form (BEGIN PRIVATE KEY), the one Java "
                f"reads: convert it (openssl pkcs8 -topk8 -nocrypt -in {key} -out KEY.pem) or run the job with the "
                "local engine (--engine local)"
            )
    return {_TLS_CONFIGURER: PEM_TLS_CONFIGURER}


def _java_s3(name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Iceberg's S3FileIO keys for the pyiceberg S3 settings in ``properties`` that Java
    spells otherwise; a CatalogError for one it has no key of the same meaning for."""
    untranslated = sorted(k for k in properties if k in _S3_UNTRANSLATED and properties[k].strip().lower() != "false")
    if untranslated:
        raise CatalogError(
            f"catalog {name!r} sets {', '.join(untranslated)}: pyiceberg's S3 client "
            f"{_S3_UNTRANSLATED[untranslated[0]]}, which the Spark engine's Iceberg S3 client is not set up to do "
            "alike: run the job with the local engine (--engine local)"
        )
    options: dict[str, str] = {}
    region = properties.get("s3.region") or properties.get("client.region")
    if region:  # pyiceberg takes s3.region first
        options["client.region"] = region
    elif "s3.endpoint" in properties:
        # An S3-compatible store's region is nominal, and pyiceberg's client (pyarrow's) signs
        # with us-east-1 where neither the catalog nor the AWS configuration names one; Java's
        # refused to start ("Unable to load region from any of the providers in the chain")
        options["client.region"] = DEFAULT_S3_REGION
    for unified, java_key in _S3_CREDENTIALS.items():
        if unified in properties and java_key not in properties:  # pyiceberg takes the s3.* key first
            options[java_key] = properties[unified]
    if "s3.endpoint" in properties and "s3.path-style-access" not in properties:
        virtual = properties.get("s3.force-virtual-addressing", "false").strip().lower() == "true"
        options["s3.path-style-access"] = str(not virtual).lower()
    if "s3.proxy-uri" in properties:
        options.setdefault("http-client.proxy-endpoint", properties["s3.proxy-uri"])
    for seconds_key, java_key in _S3_TIMEOUTS.items():
        if seconds_key in properties and java_key not in properties:
            try:
                options[java_key] = str(max(1, round(float(properties[seconds_key]) * 1000)))
            except ValueError:
                raise CatalogError(f"catalog {name!r} sets {seconds_key} to a value that is not seconds") from None
    return options


def refuse_unopenable(config: CatalogConfig) -> None:
    """A CatalogError, in one line, if the Spark engine cannot open the job's catalog
    ``config`` (``spark_catalog_properties``): checked by a run before it writes anything,
    and by ``plan --engine spark``."""
    from bulldozer.warehouse.catalog import catalog_properties

    properties = catalog_properties(config)
    if properties is not None:  # the embedded catalog: a SQL catalog in a SQLite file
        spark_catalog_properties(config.name, properties)


def _catalog_type(name: str, properties: Mapping[str, str]) -> str:
    """The catalog's type as pyiceberg reads it: ``type``, else inferred from ``uri``."""
    given = properties.get("type")
    if given:
        return given.lower()
    from pyiceberg.catalog import infer_catalog_type

    try:
        inferred = infer_catalog_type(name, dict(properties))
    except ValueError:  # its message repeats the uri, password and all
        inferred = None
    if inferred is None:
        raise CatalogError(
            f"catalog {name!r} has no type, and its uri does not tell it (http… is REST, thrift… Hive, "
            "sqlite… or postgresql… SQL): give its type"
        )
    return str(inferred.value)


#: PyMySQL's connection settings a MySQL URL's query may hold, and MariaDB Connector/J's of
#: the same meaning (its timeouts in milliseconds, PyMySQL's in seconds)
_MYSQL_SETTINGS = {"connect_timeout": "connectTimeout", "read_timeout": "socketTimeout"}
#: libpq's connection settings a PostgreSQL URL's query may hold, and pgjdbc's of the same
#: meaning (a connect timeout in seconds in both)
_PG_SETTINGS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
}


def _jdbc(name: str, uri: str, timeout: float | None) -> dict[str, str]:
    """Iceberg's JDBC catalog properties (``uri``, ``jdbc.*``) for the pyiceberg SQL catalog
    on the SQLAlchemy URL ``uri``: a SQLite file (absolute, as pyiceberg resolves a relative
    one against this process's folder when it opens it) or a PostgreSQL database."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:
        raise CatalogError(f"catalog {name!r} has a uri that is not a database URL") from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        return _postgres(name, url, timeout)
    if backend in ("mysql", "mariadb"):
        return _mysql(name, url, timeout)
    if backend != "sqlite":
        raise CatalogError(
            f"catalog {name!r} is a SQL catalog on {backend}: the Spark engine opens a SQL catalog in a SQLite "
            "file or a PostgreSQL, MySQL or MariaDB database (Iceberg's JDBC catalog on the same one; it ships no "
            "other database's driver): run the job with the local engine (--engine local), or serve the catalog "
            "over REST"
        )
    if not url.database or url.database == ":memory:" or url.database.startswith("file:") or url.query:
        raise CatalogError(
            f"catalog {name!r} is a SQL catalog in an in-memory or URI-form SQLite database: the Spark engine opens "
            "a SQL catalog in a SQLite file named by its path only (sqlite:////path/to/catalog.db)"
        )
    return {"uri": f"jdbc:sqlite:{Path(url.database).absolute()}"}


def _refuse_settings(name: str, database: str, unknown: list[str], known: str) -> None:
    """A CatalogError naming the settings of the uri's query (of a catalog on ``database``)
    the Spark engine's JDBC driver would not take alike, if any."""
    if unknown:
        raise CatalogError(
            f"catalog {name!r} is a SQL catalog on {database} whose uri sets {', '.join(unknown)}, "
            f"which the Spark engine's JDBC driver is not set up to take alike (it takes {known}): run the job with "
            "the local engine (--engine local)"
        )


def _query(url: Any) -> dict[str, str]:
    """The settings of ``url``'s query, the last where one is given twice (as the drivers take it)."""
    return {k: (v if isinstance(v, str) else v[-1]) for k, v in url.query.items()}


def _server(scheme: str, url: Any, host: str, port: int) -> dict[str, str]:
    """The JDBC URL of the database server ``url`` names (``host``, ``port``: its, or the
    defaults), and its user and password as the driver's properties, never in the URL."""
    from urllib.parse import quote

    host = f"[{host}]" if ":" in host else host
    options = {"uri": f"jdbc:{scheme}://{host}:{port}/{quote(url.database or '', safe='')}"}
    if url.username:
        options["jdbc.user"] = url.username
    if url.password is not None:
        options["jdbc.password"] = str(url.password)
    return options


def _postgres(name: str, url: Any, timeout: float | None) -> dict[str, str]:
    """Iceberg's JDBC catalog properties for the PostgreSQL database of the SQLAlchemy
    ``url``: the JDBC URL names its host, port and database; the user, the password and the
    settings of its query (``_PG_SETTINGS``) are pgjdbc's connection properties (``jdbc.*``,
    which Iceberg hands to the driver), and ``timeout`` (``BULLDOZER_CATALOG_TIMEOUT``)
    bounds connecting and each answer unless the query sets a connect timeout of its own."""
    query = _query(url)
    known = ", ".join(sorted(_PG_SETTINGS))
    _refuse_settings(name, "PostgreSQL", sorted(k for k in query if k not in _PG_SETTINGS), known)
    if not url.host:
        raise CatalogError(
            f"catalog {name!r} is a SQL catalog on PostgreSQL whose uri names no host (a Unix socket): the Spark "
            "engine's JDBC driver connects over TCP only; name the host (postgresql+psycopg2://user@host:5432/db)"
        )
    options = _server("postgresql", url, url.host, url.port or 5432)
    for key, value in query.items():
        options[f"jdbc.{_PG_SETTINGS[key]}"] = value
    if timeout is not None:
        seconds = str(max(1, math.ceil(timeout)))
        options.setdefault("jdbc.connectTimeout", seconds)
        options.setdefault("jdbc.loginTimeout", seconds)
        options.setdefault("jdbc.socketTimeout", seconds)
    return options


def _mysql(name: str, url: Any, timeout: float | None) -> dict[str, str]:
    """Iceberg's JDBC catalog properties for the MySQL or MariaDB database of the SQLAlchemy
    ``url`` (PyMySQL), through MariaDB's Connector/J (it speaks to both servers): the JDBC
    URL names the host (PyMySQL's default, localhost over TCP, where none is named), port
    and database; the user and password are the driver's properties, and the query's
    timeouts (``_MYSQL_SETTINGS``) too, in milliseconds; a character set other than utf8mb4
    (both drivers' default) or another setting is refused."""
    query = _query(url)
    charset = query.pop("charset", "utf8mb4")
    unknown = {k for k in query if k not in _MYSQL_SETTINGS} | ({"charset"} if charset.lower() != "utf8mb4" else set())
    _refuse_settings(name, url.get_backend_name(), sorted(unknown), "connect_timeout, read_timeout and charset=utf8mb4")
    options = _server("mariadb", url, url.host or "localhost", url.port or 3306)
    for key, value in query.items():
        try:
            options[f"jdbc.{_MYSQL_SETTINGS[key]}"] = str(max(1, round(float(value) * 1000)))
        except ValueError:
            raise CatalogError(f"catalog {name!r} sets {key} in its uri to a value that is not seconds") from None
    if timeout is not None:
        for key in ("jdbc.connectTimeout", "jdbc.socketTimeout"):
            options.setdefault(key, str(max(1, round(timeout * 1000))))
    return options
