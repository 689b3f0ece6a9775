"""A lakehouse as production runs one: tables in an S3-compatible object store (S3Proxy)
behind Apache Iceberg's own REST catalog server, or behind a SQL catalog kept in
PostgreSQL or MariaDB, or tables behind a Hive Metastore, all real servers on loopback
(``scripts/services/lakehouse.sh``, ``scripts/services/postgres.sh``,
``scripts/services/mysql.sh``, ``scripts/services/hive.sh``). Every other test reads tables in local files through
a SQL catalog; these read them through the operator's catalogs (``BULLDOZER_CATALOGS``)
with the store's credentials, on both engines and by every read path."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import LessThan
from sqlalchemy.engine import make_url

from bulldozer.codec.digest import Digest, digest_arrays
from bulldozer.errors import CatalogError
from bulldozer.kv import KvClient
from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.load.runner import run_job
from bulldozer.schema.job import build_job_schema
from bulldozer.spec import load_spec_text
from bulldozer.spec.loader import LoadedSpec
from bulldozer.warehouse.catalog_tls import rest_catalog, tls_settings
from bulldozer.warehouse.sample import SAMPLE_SCHEMA, _as_table_schema, generate_sample
from tests.conftest import REPO
from tests.integration import services
from tests.integration.proxies import Proxy

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text().replace("min_rows: 1000", "min_rows: 1")
TABLE = "sample.user_item_scores"
S3_SECRET = "bulldozer-secret"  # scripts/services/lakehouse.sh


@pytest.fixture(scope="module", autouse=True)
def _spark_session() -> Iterator[None]:
    yield
    from bulldozer.load.engines.spark import stop_spark_session

    stop_spark_session()


@pytest.fixture(scope="module")
def s3() -> dict[str, str]:
    """The store's client properties, as an operator gives them to a catalog."""
    port = services.lakehouse()
    return {
        "s3.endpoint": f"http://127.0.0.1:{port}",
        "s3.access-key-id": "bulldozer",
        "s3.secret-access-key": S3_SECRET,
        "s3.region": "us-east-1",
    }


def _create(catalog: Any, files: int = 3) -> Any:
    """The sample table, 1,000 rows a file (three files: three splits)."""
    catalog.create_namespace_if_not_exists("sample")
    if catalog.table_exists(TABLE):
        catalog.purge_table(TABLE)
    table = catalog.create_table(TABLE, schema=SAMPLE_SCHEMA)
    for start in range(0, 1_000 * files, 1_000):
        table.append(_as_table_schema(table, generate_sample(1_000, seed=7, start=start)))
    return table


@pytest.fixture(scope="module")
def rest(s3: dict[str, str]) -> dict[str, str]:
    """Iceberg's REST catalog server, its warehouse in the store, holding the sample table."""
    port = int(s3["s3.endpoint"].rpartition(":")[2]) + 1
    properties = {"type": "rest", "uri": f"http://127.0.0.1:{port}", **s3}
    table = _create(load_catalog("lake", **properties))
    assert table.location().startswith("s3://lake/")
    return properties


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.integration.test_security import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_front(rest: dict[str, str], pki: Path) -> Iterator[Proxy]:
    """An HTTPS front for the REST catalog, as one is served behind a proxy: its certificate
    is a private certificate authority's (``test_security.make_pki``), and it takes only
    clients with a certificate of that authority (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    front = Proxy(int(rest["uri"].rpartition(":")[2]), tls=context)
    yield front
    front.close()


@pytest.fixture(scope="module")
def rest_tls(rest: dict[str, str], pki: Path, tls_front: Proxy) -> dict[str, str]:
    """The REST catalog served over HTTPS by a private certificate authority's certificate,
    to clients with one of its certificates: the catalog's TLS settings name the authority's
    certificate and the client's certificate and key (PEM files)."""
    return {
        **rest,
        "uri": f"https://127.0.0.1:{tls_front.port}",
        "ssl.cabundle": str(pki / "ca.pem"),
        "ssl.client.cert": str(pki / "loader.pem"),
        "ssl.client.key": str(pki / "loader.key"),
    }


def _spec(text: str = TEMPLATE, *, partitions: int | None = None) -> LoadedSpec:
    if partitions is not None:
        text = text.replace("    in_flight_batches: 4 ", f"    partitions: {partitions}\n    in_flight_batches: 4 ")
    return load_spec_text(text, "job.yaml", env={})


def _expected(properties: dict[str, str], row_filter: str | None = None) -> Digest:
    """What a version of the table must hold, from pyiceberg's own read and the encoder alone."""
    catalog = rest_catalog("lake", properties) if tls_settings(properties) else load_catalog("lake", **properties)
    table = catalog.load_table(TABLE)
    job = build_job_schema(_spec().spec, table.schema())
    scan = table.scan(row_filter=row_filter) if row_filter else table.scan()
    encoded = RowEncoder(job.proto).encode(scan.to_arrow())
    return digest_arrays(encoded.keys, encoded.values)


def _records(dal: KvClient, version: str) -> dict[bytes, dict[str, Any]]:
    """A version's records, each value decoded with the version's own schema."""
    from google.protobuf.json_format import MessageToDict

    from bulldozer.schema.compile import load_message_classes

    info = dal.describe(version)
    (value_class,) = load_message_classes(info.value_descriptor_set, info.value_message)
    return {
        key: MessageToDict(value_class.FromString(value), always_print_fields_with_no_presence=True)
        for key, value in dal.scan(namespace=version)
    }


@pytest.mark.spark
def test_a_store_without_a_region_is_read_by_icebergs_spark_reader_as_by_pyiceberg(
    s3: dict[str, str], rest: dict[str, str], tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3-compatible store's region is nominal: pyiceberg read it without one, and Iceberg's
    Spark reader failed the run (``SdkClientException: Unable to load region from any of the
    providers in the chain``)."""
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    no_region = {k: v for k, v in rest.items() if k != "s3.region"}
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": no_region}))
    record = run_job(_spec(partitions=4), dal, engine="spark", home=str(tmp_path))
    assert (record.rows, dal.describe(record.version).digest) == (3_000, _expected(rest).value)


@pytest.fixture(scope="module")
def databases(s3: dict[str, str]) -> Callable[[str], dict[str, str]]:
    """A SQL catalog kept in a database server — ``postgres``, or ``mysql`` (MariaDB, for
    MySQL's protocol): pyiceberg's SqlCatalog; Iceberg's JdbcCatalog on the same database —,
    its warehouse in the store, holding the sample table; each made once."""
    made: dict[str, dict[str, str]] = {}

    def of(kind: str) -> dict[str, str]:
        if kind not in made:
            url = services.postgres_url() if kind == "postgres" else services.mysql_url()
            properties = {"type": "sql", "uri": url, "warehouse": f"s3://lake/{kind}", **s3}
            table = _create(load_catalog("lake", **properties))
            assert table.location().startswith(f"s3://lake/{kind}/")
            made[kind] = properties
        return made[kind]

    return of


@pytest.fixture(scope="module")
def hive() -> dict[str, str]:
    """A Hive catalog: a Hive Metastore (``scripts/services/hive.sh``) holding the sample
    table, whose files are local (the metastore checks a table's location with Hadoop's file
    systems, and Spark's Hive jars have no ``s3:`` one)."""
    properties = {"type": "hive", "uri": services.hive_uri()}
    # Hive 2.3's metastore has no `timestamp with local time zone` column type: pyiceberg
    # creates the table with Hive 2's types (reading it takes nothing of the kind)
    table = _create(load_catalog("lake", **properties, **{"hive.hive2-compatible": "true"}))
    assert table.location().startswith("file:")
    return properties


@pytest.fixture(scope="module", params=["postgres", "mysql"])
def database(request: pytest.FixtureRequest, databases: Callable[[str], dict[str, str]]) -> dict[str, str]:
    return databases(str(request.param))


def _by(kind: str, engine: str, partitions: int | None, path: str) -> Any:
    marks = [pytest.mark.spark] if engine == "spark" else []
    return pytest.param(kind, engine, partitions, marks=marks, id=f"{kind}-{path}")


@pytest.mark.parametrize(
    ("kind", "engine", "partitions"),
    [
        _by("rest", "local", None, "local"),
        _by("rest", "spark", 3, "spark-splits"),
        _by("rest", "spark", 4, "spark-by-key"),
        # the Spark engine's own splits are planned by pyiceberg on the driver, whatever the
        # catalog: only Iceberg's Spark reader (by key) opens a database's catalog in the JVM
        _by("postgres", "local", None, "local"),
        _by("postgres", "spark", 4, "spark-by-key"),
        _by("mysql", "local", None, "local"),
        _by("mysql", "spark", 4, "spark-by-key"),
        _by("hive", "local", None, "local"),
        _by("hive", "spark", 4, "spark-by-key"),
        # over HTTPS, a private authority's certificate and a client certificate (mutual TLS)
        _by("rest_tls", "local", None, "local"),
        _by("rest_tls", "spark", 4, "spark-by-key"),
    ],
)
def test_every_engine_loads_a_table_in_s3_from_the_operators_catalog(
    kind: str,
    engine: str,
    partitions: int | None,
    databases: Callable[[str], dict[str, str]],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    dal: KvClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """spark-splits: each task reads its files with pyiceberg's S3 client; spark-by-key:
    Iceberg's Spark reader reads the table, with Iceberg's own S3 client — which the driver
    lacked: the run failed with Hadoop's ``No FileSystem for scheme "s3"``, its two Java
    stack traces on one 20 KB line. A SQL catalog on PostgreSQL or MySQL was refused by the
    Spark engine (it shipped SQLite's JDBC driver only), and the local engine failed to
    open it (``No module named 'psycopg2'``, ``'pymysql'``): pyiceberg now opens it through
    psycopg2 or PyMySQL, and Iceberg's Spark reader through Iceberg's JDBC catalog on the
    same database, the user and password the JDBC driver's properties. A Hive catalog failed
    on the local engine (``Apache Hive support not installed``: pyiceberg's Thrift client was
    not installed); its table's files are local (``hive``). A REST catalog over HTTPS with a
    private authority's certificate, taking clients with a certificate of its own
    (``rest_tls``): pyiceberg's ``ssl`` setting could not be given (a catalog's settings are
    strings), and Iceberg's Java REST client has no such setting (its handshake failed).
    The same version on every path."""
    operators_catalog = dict(request.getfixturevalue(kind)) if kind in ("rest", "hive", "rest_tls") else databases(kind)
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": operators_catalog}))
    if kind == "rest_tls":  # as on many machines: requests let it override the catalog's bundle
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    expected = _expected(operators_catalog)
    record = run_job(_spec(partitions=partitions), dal, engine=engine, home=str(tmp_path))
    info = dal.describe(record.version)
    assert (record.engine, record.rows, info.record_count, info.digest) == (engine, 3_000, 3_000, expected.value)
    if engine == "spark":  # the driver JVM's arguments, which every user of the machine can read
        password = make_url(operators_catalog["uri"]).password if operators_catalog["type"] == "sql" else None
        _assert_no_catalog_setting_in_the_drivers_arguments([S3_SECRET, *([password] if password else [])])


def _assert_no_catalog_setting_in_the_drivers_arguments(secrets: list[str]) -> None:
    """pyspark started the driver JVM as ``spark-submit --conf KEY=VALUE …`` with every
    setting, the catalog's secrets too, readable in ``/proc/PID/cmdline`` (``ps``) by any
    user for as long as it ran; they now reach it over the gateway's socket."""
    from bulldozer.load.engines.spark import session

    arguments = Path(f"/proc/{session._GATEWAY.proc.pid}/cmdline").read_bytes().decode()
    assert "spark.master" in arguments  # the JVM's own arguments were read
    assert session.AFTER_LAUNCH_PREFIX not in arguments
    assert not [secret for secret in secrets if secret in arguments]


def test_a_database_refusing_the_catalogs_password_fails_the_run_in_one_line_without_it(
    database: dict[str, str], tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line naming what the server said, neither password in it nor in the refused run's
    record (the schema stage opens the catalog with pyiceberg on either engine)."""
    from bulldozer.errors import BulldozerError
    from bulldozer.kv.types import State

    wrong = make_url(database["uri"]).set(password="not-the-password-9431")
    properties = {**database, "uri": wrong.render_as_string(hide_password=False)}
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": properties}))
    with pytest.raises(BulldozerError) as caught:
        run_job(_spec(), dal, home=str(tmp_path))
    said = str(caught.value)
    assert ("password authentication failed" in said or "Access denied" in said) and "\n" not in said
    assert "not-the-password-9431" not in said and make_url(database["uri"]).password not in said
    (refused,) = dal.list_namespaces("user_item_scores")  # the refused run's record, holding nothing
    assert (refused.state, refused.record_count) == (State.FAILED, 0)
    assert "not-the-password-9431" not in json.dumps(refused.to_json())


def test_a_rest_catalog_refusing_a_client_without_its_certificate_fails_the_run_in_one_line(
    rest_tls: dict[str, str], tls_front: Proxy, tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog's server asks for a client certificate: a catalog without one fails the
    run at its start, in one line, leaving only the refused run's empty FAILED record."""
    from bulldozer.kv.types import State

    without = {k: v for k, v in rest_tls.items() if not k.startswith("ssl.client.")}
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": without}))
    refused = tls_front.handshakes_refused
    before = dal.list_namespaces("user_item_scores_tls")
    with pytest.raises(CatalogError) as failed:
        run_job(
            _spec(TEMPLATE.replace("alias: user_item_scores", "alias: user_item_scores_tls")), dal, home=str(tmp_path)
        )
    said = str(failed.value)
    assert said.startswith(f"cannot open catalog 'lake' at {without['uri']}: ") and "\n" not in said, said
    assert said.endswith(
        "(the TLS handshake failed: ssl.cabundle, ssl.client.cert, ssl.client.key say whom it trusts and who it is)"
    )
    assert tls_front.handshakes_refused > refused  # refused by the server, for want of a certificate
    (record,) = [ns for ns in dal.list_namespaces("user_item_scores_tls") if ns not in before]
    assert (record.state, record.record_count) == (State.FAILED, 0)  # the refused run's record, holding nothing


def test_a_query_and_a_delta_read_a_table_in_s3_from_icebergs_rest_catalog(
    rest: dict[str, str], tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query (DuckDB over pyiceberg's batches) and a delta (the files two snapshots differ
    by, from the manifests in the store) read the store as the table source does."""
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": rest}))
    query = TEMPLATE.replace(
        "    table: sample.user_item_scores", "    query: SELECT * FROM sample.user_item_scores WHERE item_id < 20"
    ).replace("alias: user_item_scores", "alias: user_item_scores_query")
    filtered = TEMPLATE.replace(
        "  key_columns: [user_id, item_id, locale]",
        '  filter: "item_id < 20"\n  key_columns: [user_id, item_id, locale]',
    ).replace("alias: user_item_scores", "alias: user_item_scores_filtered")
    expected = _expected(rest, "item_id < 20")
    assert 0 < expected.count < 3_000
    from_table = run_job(_spec(filtered), dal, engine="local", home=str(tmp_path))
    assert dal.describe(from_table.version).digest == expected.value
    from_query = run_job(_spec(query), dal, engine="local", home=str(tmp_path))
    assert from_query.rows == expected.count
    # the same values (a query's fields are all optional: a false or zero is written, not left out)
    assert _records(dal, from_query.version) == _records(dal, from_table.version)

    delta = _spec(TEMPLATE.replace("  duplicate_keys: fail", "  duplicate_keys: fail\n  mode: delta"))
    first = run_job(delta, dal, engine="local", home=str(tmp_path))  # no version yet: a full run
    table = load_catalog("lake", **rest).load_table(TABLE)
    table.delete(LessThan("user_id", 1_000_100))
    table.append(_as_table_schema(table, generate_sample(200, seed=9, start=5_000)))
    expected = _expected(rest)
    second = run_job(delta, dal, engine="local", home=str(tmp_path))
    info = dal.describe(second.version)
    assert (second.mode, second.delta["base"] if second.delta else None) == ("delta", first.version)
    assert (second.rows, info.record_count, info.digest) == (expected.count, expected.count, expected.value)
    _create(load_catalog("lake", **rest))  # the module's table as it was


@pytest.mark.spark
def test_the_spark_engine_reads_a_sql_catalogs_table_in_s3(
    s3: dict[str, str], tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's SQL catalog with its warehouse in the store: Iceberg's JDBC catalog
    reads files with Hadoop's file systems unless told otherwise, and Hadoop has no ``s3:``
    (``bulldozer.load.engines.spark.catalog`` gives it Iceberg's ResolvingFileIO)."""
    sql = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": "s3://lake/sql", **s3}
    _create(load_catalog("lake", **sql), files=1)
    monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": sql}))
    expected = _expected(sql)
    record = run_job(_spec(partitions=4), dal, engine="spark", home=str(tmp_path / "home"))
    info = dal.describe(record.version)
    assert (record.rows, info.record_count, info.digest) == (1_000, 1_000, expected.value)


@pytest.mark.spark
def test_sparks_rest_client_waits_no_longer_than_the_catalog_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iceberg's Java REST client (Spark's reader opens the table with it) asked a catalog
    that took the connection and never answered, and waited: still waiting after 90 s here.
    It gets ``BULLDOZER_CATALOG_TIMEOUT`` as pyiceberg does."""
    import socket
    import threading
    import time

    from bulldozer.load.engines.spark.datasource import worker_error
    from bulldozer.load.engines.spark.session import spark_session

    monkeypatch.setenv("BULLDOZER_CATALOG_TIMEOUT", "2")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        catalog = {"type": "rest", "uri": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        spark = spark_session("lake", catalog, str(tmp_path), "local[2]")
        hang_up = threading.Timer(40, silent.close)  # a client that waits for ever fails then
        hang_up.start()
        started = time.monotonic()
        with pytest.raises(Exception) as raised:
            spark.read.table("lake.sample.t").count()
        hang_up.cancel()
        assert time.monotonic() - started < 30
    said = str(worker_error(raised.value))
    assert said.startswith("the Spark job failed: RESTException: ") and "Read timed out" in said, said


class _CountingProxy:
    """An HTTP proxy on loopback (requests in absolute form, hop-by-hop headers dropped, as
    a proxy does) forwarding to the store, keeping each request's user agent."""

    def __init__(self) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        self.agents: list[str] = []
        agents = self.agents
        hop = {"connection", "proxy-connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                url = urlsplit(self.path)
                agents.append(self.headers.get("User-Agent", ""))
                dropped = hop | {h.strip().lower() for h in (self.headers.get("Connection") or "").split(",")}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                length = int(self.headers.get("Content-Length") or 0)
                upstream = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
                path = url.path + (f"?{url.query}" if url.query else "")
                upstream.request(self.command, path, self.rfile.read(length) if length else None, headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in hop | {"content-length"}:
                        self.send_header(key, value)
                head = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", head or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.spark
def test_both_engines_reach_the_store_through_the_operators_proxy(
    rest: dict[str, str], tmp_path: Path, dal: KvClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``s3.proxy-uri``: pyiceberg's S3 client took it, Iceberg's Java S3 client (Spark's
    reader) did not and went to the store directly, round the operator's proxy."""
    proxy = _CountingProxy()
    try:
        monkeypatch.setenv("BULLDOZER_CATALOGS", json.dumps({"lake": {**rest, "s3.proxy-uri": proxy.uri}}))
        record = run_job(_spec(partitions=4), dal, engine="spark", home=str(tmp_path))
    finally:
        proxy.server.shutdown()
    assert dal.describe(record.version).digest == _expected(rest).value
    java = [agent for agent in proxy.agents if "aws-sdk-java" in agent]  # Spark's reader's requests
    assert java and len(java) < len(proxy.agents), proxy.agents  # and pyiceberg's (planning, checks)
