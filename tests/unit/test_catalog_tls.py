"""A REST catalog's TLS settings (``bulldozer.warehouse.catalog_tls``): checked before a run
reads anything, given to pyiceberg as its ``ssl`` setting, and to Iceberg's Java REST client
through Bulldozer's configurer (``native/java``), which reads the same keys."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from bulldozer.errors import CatalogError
from bulldozer.load.engines.spark import catalog as spark_catalog
from bulldozer.load.engines.spark.catalog import PEM_TLS_CONFIGURER, spark_catalog_properties
from bulldozer.warehouse.catalog_tls import SETTINGS, check, pyiceberg_ssl
from tests.conftest import REPO

REST = {"type": "rest", "uri": "https://catalog.example.com"}


def _pem(folder: Path, stem: str, key_format: serialization.PrivateFormat, password: bytes | None = None) -> Path:
    """A self-signed certificate ``stem.pem`` and its key ``stem.key`` (RSA, in ``key_format``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    (folder / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, key_format, encryption))
    (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return folder / stem


def test_valid_settings_pass_and_become_pyicebergs_ssl_setting(tmp_path: Path) -> None:
    client = _pem(tmp_path, "client", serialization.PrivateFormat.PKCS8)
    settings = {
        **REST,
        "ssl.cabundle": f"{client}.pem",
        "ssl.client.cert": f"{client}.pem",
        "ssl.client.key": f"{client}.key",
    }
    check("lake", "rest", settings)
    assert pyiceberg_ssl(settings) == {
        **REST,
        "ssl": {"cabundle": f"{client}.pem", "client": {"cert": f"{client}.pem", "key": f"{client}.key"}},
    }
    assert pyiceberg_ssl(REST) == REST
    # a certificate file holding its key too, as requests takes one
    both = tmp_path / "both.pem"
    both.write_bytes(Path(f"{client}.pem").read_bytes() + Path(f"{client}.key").read_bytes())
    check("lake", "rest", {**REST, "ssl.client.cert": str(both)})
    assert pyiceberg_ssl({**REST, "ssl.client.cert": str(both)})["ssl"] == {"client": {"cert": str(both)}}


def test_settings_no_engine_would_apply_as_given_are_refused_in_one_line(tmp_path: Path) -> None:
    client = _pem(tmp_path, "client", serialization.PrivateFormat.PKCS8)
    other = _pem(tmp_path, "other", serialization.PrivateFormat.PKCS8)
    locked = _pem(tmp_path, "locked", serialization.PrivateFormat.PKCS8, password=b"passphrase")
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    cases = [
        ({"ssl.verify": "false"}, "rest", r"sets ssl\.verify, which no engine reads"),
        ({"ssl.cabundle": f"{client}.pem"}, "sql", r"TLS settings are a REST catalog's, and this one is of type sql"),
        ({"ssl.client.key": f"{client}.key"}, "rest", r"sets ssl\.client\.key without ssl\.client\.cert"),
        ({"ssl.cabundle": str(tmp_path / "gone.pem")}, "rest", r"is not a file of PEM certificates \(.*No such file"),
        ({"ssl.cabundle": str(tmp_path / "empty.pem")}, "rest", r"is not a file of PEM certificates"),
        (
            {"ssl.client.cert": f"{client}.pem", "ssl.client.key": f"{other}.key"},
            "rest",
            r"do not load as a PEM certificate and its private key \(key values mismatch\)",
        ),
        (
            {"ssl.client.cert": f"{locked}.pem", "ssl.client.key": f"{locked}.key"},
            "rest",
            r"is encrypted, and no engine can be given its passphrase",
        ),
    ]
    for settings, kind, said in cases:
        with pytest.raises(CatalogError, match=said) as refused:
            check("lake", kind, {**REST, **settings})
        assert "\n" not in str(refused.value)


def test_the_java_configurer_reads_the_settings_python_checks() -> None:
    """One list of keys: bulldozer.iceberg.PemTlsConfigurer reads the catalog's properties by
    the names catalog_tls.SETTINGS holds (what pyiceberg is given them from)."""
    java = (REPO / "native" / "java" / "src" / "bulldozer" / "iceberg" / "PemTlsConfigurer.java").read_text()
    assert set(re.findall(r'static final String \w+ = "(ssl\.[a-z.]+)";', java)) == set(SETTINGS)
    assert f"package {PEM_TLS_CONFIGURER.rpartition('.')[0]};" in java
    assert f"public class {PEM_TLS_CONFIGURER.rpartition('.')[2]} " in java


def test_the_spark_engine_gives_icebergs_rest_client_bulldozers_configurer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkcs8 = _pem(tmp_path, "pkcs8", serialization.PrivateFormat.PKCS8)
    pkcs1 = _pem(tmp_path, "pkcs1", serialization.PrivateFormat.TraditionalOpenSSL)
    jar = tmp_path / "bulldozer-iceberg.jar"
    jar.write_bytes(b"built")
    monkeypatch.setattr(spark_catalog, "JAVA_JAR", jar)
    client = {"ssl.client.cert": f"{pkcs8}.pem", "ssl.client.key": f"{pkcs8}.key"}
    options = spark_catalog_properties("lake", {**REST, **client})
    assert options["rest.client.tls.configurer-impl"] == PEM_TLS_CONFIGURER
    assert options["ssl.client.key"] == f"{pkcs8}.key"  # read by the configurer from the catalog's properties
    assert "rest.client.tls.configurer-impl" not in spark_catalog_properties("lake", REST)
    with pytest.raises(CatalogError, match=r"is not in PKCS #8 form .*openssl pkcs8 -topk8 -nocrypt"):
        spark_catalog_properties("lake", {**REST, "ssl.client.cert": f"{pkcs1}.pem", "ssl.client.key": f"{pkcs1}.key"})
    theirs = {**REST, **client, "rest.client.tls.configurer-impl": "com.example.Tls"}
    with pytest.raises(CatalogError, match=r"sets both rest\.client\.tls\.configurer-impl and ssl\.client\.cert"):
        spark_catalog_properties("lake", theirs)
    monkeypatch.setattr(spark_catalog, "JAVA_JAR", tmp_path / "not-built.jar")
    with pytest.raises(CatalogError, match=r"they are not built here .*--engine local"):
        spark_catalog_properties("lake", {**REST, **client})
