"""The generated Python client, pip-installed into a fresh virtual environment, reading from
a real DAL process."""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

from bulldozer.codegen.python import generate_python_client
from bulldozer.kv import KvClient
from bulldozer.load.runner import run_job
from bulldozer.names import short_version
from bulldozer.schema.job import build_job_schema
from tests.integration.kv_fixtures import sealed_version
from tests.integration.test_kv_server import _free_port, _start
from tests.integration.test_run import KEY, read, spec, table
from tests.schemas import ALL_TYPES, spec_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READ = """
import json, sys
from bulldozer_client_user_item_scores import KeyMessage, Reader, SchemaMismatchError
from google.protobuf import json_format
try:
    with Reader(sys.argv[1], version=sys.argv[3] if len(sys.argv) > 3 else None) as reader:
        value = reader.get(KeyMessage(**json.loads(sys.argv[2])))
        missing = reader.batch_get([KeyMessage(user_id=1, item_id=1, locale="xx")])
        print(json.dumps({"version": reader.version, "value": json_format.MessageToDict(value, preserving_proto_field_name=True), "missing": missing == [None]}))
except SchemaMismatchError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-venv")
    venv.create(root / "venv", with_pip=True)
    return root / "venv" / "bin" / "python"


def test_generated_python_client_reads_and_checks_compatibility(tmp_path: Path, client_venv: Path) -> None:
    home = tmp_path / "h"
    from bulldozer.warehouse.sample import create_sample_warehouse

    create_sample_warehouse(home, rows=1_500)
    loaded = spec()
    job = build_job_schema(loaded.spec, table(home).schema())
    first = generate_python_client(loaded.spec, job, tmp_path / "pkg")
    again = generate_python_client(loaded.spec, job, tmp_path / "pkg2")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in again]  # deterministic
    install = subprocess.run(
        [str(client_venv), "-m", "pip", "install", "-q", str(tmp_path / "pkg")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    script = tmp_path / "read.py"
    script.write_text(READ)

    store, port = tmp_path / "store", _free_port()
    server = _start(store, port)
    try:
        address = f"127.0.0.1:{port}"
        with KvClient(address) as dal:
            first_run = run_job(loaded, dal, home=str(home))
            expected = read(dal, "user_item_scores", KEY)

            def reader(*version: str, **env: str) -> dict[str, object]:
                out = subprocess.run(
                    [str(client_venv), str(script), address, json.dumps(KEY), *version],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**os.environ, **env},
                )
                assert out.returncode == 0, out.stderr[-2000:]
                return dict(json.loads(out.stdout))

            got = reader()
            assert got["value"] == expected and got["missing"] is True
            # a DAL on loopback (a sidecar) is dialled directly, whatever HTTP proxy the machine sets
            assert reader(http_proxy=f"http://127.0.0.1:{_free_port()}") == got

            # a newer version with an added column still reads with the old client
            with table(home).update_schema() as update:
                from pyiceberg.types import StringType

                update.add_column("note", StringType())
            from bulldozer.warehouse.sample import overwrite_sample

            overwrite_sample(table(home), rows=1_500, variant=0)
            wider = spec(**{"    - counters\n": "    - counters\n    - note\n"})
            newer = run_job(wider, dal, home=str(home))
            assert reader()["version"] == newer.version
            pinned = reader(short_version(first_run.version))  # the same version argument as the CLI's
            assert pinned["version"] == first_run.version and pinned["value"] == expected

            # a version whose schema the client would misread is refused at connect
            incompatible = build_job_schema(
                spec_for(["id", "tenant"], name="user_item_scores"), ALL_TYPES, python=False
            )
            bad = sealed_version(dal, "user_item_scores", incompatible, [(b"\x08\x01", b"")])
            dal.compare_and_set_alias("user_item_scores", newer.version, bad, reason="test: incompatible schema")
            refused = reader()
            assert "refused" in refused and "key fields changed" in str(refused["refused"])
    finally:
        server.terminate()
        server.wait(timeout=20)
