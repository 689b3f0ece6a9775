"""Generated Java and Go clients: built with their own toolchains (mvn package; go build,
go vet) and run against a real DAL, reading the same values Python decodes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.kv import KvClient
from bulldozer.kv.tls import channel_credentials
from bulldozer.load.runner import run_job
from bulldozer.names import new_version_name, short_version
from bulldozer.warehouse.sample import create_sample_warehouse
from tests import jvm
from tests.conftest import REPO
from tests.integration.kv_fixtures import seal_as_loaded
from tests.integration.test_kv_server import _free_port, _start, stop_servers
from tests.integration.test_run import KEY, read, spec
from tests.integration.test_security import make_pki

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TEMPLATE = "templates/move_data_to_kv_dal.yaml"
MISSING = {"user_id": 1, "item_id": 2, "locale": "xx_XX"}


@pytest.fixture(scope="module")
def loaded_dal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A DAL process over a store holding two versions of user_item_scores."""
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog
    from bulldozer.warehouse.sample import overwrite_sample

    root = tmp_path_factory.mktemp("native")
    home = root / "h"
    create_sample_warehouse(home, rows=2_000)
    port = _free_port()
    server = _start(root / "store", port)
    # a second DAL on the same store, with TLS and a reader token
    make_pki(root)
    auth = root / "auth.yaml"
    digest = hashlib.sha256(b"native-reader-token").hexdigest()
    auth.write_text(json.dumps({"principals": {"reader": {"token_sha256": digest, "permissions": {"*": ["read"]}}}}))
    secure_port = _free_port()
    tls = ["--tls-cert", str(root / "server.pem"), "--tls-key", str(root / "server.key"), "--auth-config", str(auth)]
    secure = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bulldozer.cli.main",
            "serve",
            "--path",
            str(root / "store"),
            "--port",
            str(secure_port),
            *tls,
        ],
        stderr=subprocess.DEVNULL,
    )
    with KvClient(f"127.0.0.1:{secure_port}", credentials=channel_credentials(root / "ca.pem")) as probe:
        probe.wait_ready(timeout=60)
    try:
        with KvClient(f"127.0.0.1:{port}") as client:
            first = run_job(spec(), client, home=str(home))
            v1 = read(client, "user_item_scores", KEY)
            table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
            overwrite_sample(table, rows=2_000, variant=1)
            run_job(spec(), client, home=str(home))
            v2 = read(client, "user_item_scores", KEY)
            # a version of the next schema generation (a deliberate breaking change), not live
            breaking = new_version_name("user_item_scores")
            client.create_namespace(breaking, "user_item_scores", schema_generation=2)
            client.put(breaking, [(b"k", b"v")])
            seal_as_loaded(client, breaking, [(b"k", b"v")])
        assert v1 != v2
        yield {
            "home": home,
            "endpoint": f"127.0.0.1:{port}",
            "secure": f"127.0.0.1:{secure_port}",
            "secure_env": {"BULLDOZER_TLS_CA": str(root / "ca.pem"), "BULLDOZER_TOKEN": "native-reader-token"},
            "v1": v1,
            "v2": v2,
            "first": first.version,
            "breaking": breaking,
        }
    finally:
        stop_servers([server, secure])


def generate(lang: str, dal: dict[str, Any], out: Path) -> None:
    """``bulldozer client`` for the DAL (which it asks for the alias's schema generation)."""
    command = ["client", TEMPLATE, "--lang", lang, "--out", str(out), "--endpoint", dal["endpoint"]]
    result = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.main", *command],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BULLDOZER_HOME": str(dal["home"])},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr


def tree(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not set(p.relative_to(folder).parts) & set(skip)
    }


def _class_major(classes: Path) -> int:
    """The class-file major version of the first compiled class under ``classes``."""
    first = next(classes.rglob("*.class")).read_bytes()
    return int.from_bytes(first[6:8], "big")


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=cwd, env={**os.environ, **(env or {})}
    )
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]} {result.stderr[-3000:]}"
    return result.stdout


def test_java_client_builds_and_reads_a_key(loaded_dal: dict[str, Any], tmp_path: Path) -> None:
    if shutil.which("mvn") is None or shutil.which("java") is None:
        pytest.fail("Maven and Java 17 are required for the Java client (apt-get install maven openjdk-17-jdk)")
    out, again = tmp_path / "java", tmp_path / "java-again"
    generate("java", loaded_dal, out)
    generate("java", loaded_dal, again)
    assert tree(out) == tree(again)  # deterministic
    assert (out / "src/main/java/dev/bulldozer/kv/v1/KvDataGrpc.java").exists()
    run(["mvn", "-q", "-B", "package"], out, jvm.maven_env())
    (jar,) = (out / "target").glob("*-all.jar")  # runnable, with its dependencies: the README's command
    readme = (out / "README.md").read_text()
    assert f"java -jar target/{jar.name} HOST:PORT" in readme and "Java 8 or newer" in readme
    assert _class_major(out / "target" / "classes") == 52  # Java 8 class files: the stated floor

    def java(*args: str, endpoint: str = loaded_dal["endpoint"], env: dict[str, str] | None = None) -> Any:
        return json.loads(run(jvm.java("-jar", str(jar), endpoint, *args), out, env))

    assert java(json.dumps(KEY)) == loaded_dal["v2"]
    assert java(json.dumps(KEY), endpoint=loaded_dal["secure"], env=loaded_dal["secure_env"]) == loaded_dal["v2"]
    assert java(json.dumps(MISSING)) is None
    assert java(json.dumps(KEY), loaded_dal["first"]) == loaded_dal["v1"]  # pinned: the full name
    assert java(json.dumps(KEY), short_version(loaded_dal["first"])) == loaded_dal["v1"]  # or the short id
    refused = subprocess.run(
        jvm.java("-jar", str(jar), loaded_dal["endpoint"], json.dumps(KEY), loaded_dal["breaking"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "schema generation 2" in refused.stderr  # refused, not misread


def test_go_client_builds_vets_and_reads_a_key(loaded_dal: dict[str, Any], tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.fail("the Go toolchain is required for the Go client")
    out, again = tmp_path / "go", tmp_path / "go-again"
    generate("go", loaded_dal, out)
    generate("go", loaded_dal, again)
    assert tree(out) == tree(again)  # deterministic, go.sum included
    run(["go", "vet", "./..."], out)
    run(["go", "build", "-o", "read", "./cmd/read"], out)

    def go(*args: str, endpoint: str = loaded_dal["endpoint"], env: dict[str, str] | None = None) -> Any:
        return json.loads(run([str(out / "read"), endpoint, *args], out, env))

    assert go(json.dumps(KEY)) == loaded_dal["v2"]
    assert go(json.dumps(KEY), endpoint=loaded_dal["secure"], env=loaded_dal["secure_env"]) == loaded_dal["v2"]
    assert go(json.dumps(MISSING)) is None
    assert go(json.dumps(KEY), loaded_dal["first"]) == loaded_dal["v1"]  # pinned
    assert go(json.dumps(KEY), short_version(loaded_dal["first"])) == loaded_dal["v1"]  # by its short id
    refused = subprocess.run(
        [str(out / "read"), loaded_dal["endpoint"], json.dumps(KEY), loaded_dal["breaking"]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "schema generation 2" in refused.stderr  # refused, not misread
    readme = (out / "README.md").read_text()
    assert "go build -o read ./cmd/read" in readme and "./read HOST:PORT '{" in readme
