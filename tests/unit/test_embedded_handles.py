"""Opening a namespace's sub-database handle while another thread writes (``EmbeddedEngine._open_handle``).

py-lmdb's ``open_db`` given no transaction begins a write transaction of its own while
holding the GIL: with another thread inside a write transaction (an ingest putting record
after record, each put giving the GIL up and taking it back), each waited on the other for
ever, the whole process with them. It hung the test suite's CI run (its one test stopped,
every thread in a futex, pytest-timeout's SIGALRM never handled) and would hang the Python
DAL serving the embedded engine: a first read of a version while another is ingested."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

#: an ingest long enough to be under way when the other thread first opens b's handle
_SCENARIO = """
import sys, threading, time
from bulldozer.kv import create_engine
from bulldozer.kv.server.rules import KvDal

path = sys.argv[1]
engine = create_engine({"type": "embedded", "path": path})
dal = KvDal(engine)
for name in ("a__v1", "b__v1"):
    dal.create_namespace(name, name[0], job_name=name[0], labels={}, snapshot_id=1)
keys = [b"k%07d" % i for i in range(1_000_000)]
engine.write_batch("a__v1", keys, [b"v"] * len(keys))
engine.close()
engine = create_engine({"type": "embedded", "path": path})  # as a new process has it: no handle opened yet
ingesting = threading.Thread(target=engine.ingest, args=("a__v1",))
ingesting.start()
time.sleep(0.1)
assert engine.scan("b__v1", None, 1) == []  # b's handle, first opened while a's ingest writes
ingesting.join()
assert engine.stored_digest("a__v1") is not None or engine.measure("a__v1").count == 1_000_000
print("done")
"""


def test_a_handle_opened_while_another_thread_writes_does_not_hang_the_process(tmp_path: Path) -> None:
    # in a process of its own: on the code before, it hangs with the GIL held, past any timeout of this one's
    done = subprocess.run(
        [sys.executable, "-c", _SCENARIO, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
