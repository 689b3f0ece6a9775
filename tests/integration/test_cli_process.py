"""What a ``bulldozer`` command-line process does to itself: a local run never imports
pandas (pyarrow would, for 0.25-0.3 s, only to check whether values are pandas objects),
nor the other commands' modules, nor the metrics its hosted DAL does not keep,
the cyclic collector waits until a run is set up (and no longer for other commands),
and a run that used DuckDB exits without nanobind's leak report on stderr."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bulldozer.cli import process
from bulldozer.warehouse.sample import create_sample_warehouse
from tests.conftest import REPO

pytestmark = pytest.mark.integration
TEMPLATE = (REPO / "templates" / "move_data_to_kv_dal.yaml").read_text()
# runs the CLI's main and, as the interpreter exits, writes which of these modules it
# imported, whether the cyclic collector is on, and the OpenBLAS and pydantic plugin settings
DRIVER = """
import atexit, json, sys
import gc, os
CHECKED = ("pandas", "duckdb", "pyparsing", "strictyaml.parser", "rich.progress", "prometheus_client",
           "bulldozer.cli.ops_cmds", "bulldozer.cli.ui_cmd")
atexit.register(lambda: print("IMPORTED", json.dumps(sorted(m for m in CHECKED if m in sys.modules))))
atexit.register(lambda: print("GC", gc.isenabled(), "BLAS", os.environ.get("OPENBLAS_NUM_THREADS"),
                              "PLUGINS", os.environ.get("PYDANTIC_DISABLE_PLUGINS")))
from bulldozer.cli import process
atexit.register(lambda: print("UNBUILT", len(process.unbuilt_models())))
atexit.register(lambda: "pyarrow" in sys.modules and print(  # Arrow's default pool, what mimalloc served
    "ARROW", sys.modules["pyarrow"].default_memory_pool().backend_name,
    sys.modules["pyarrow"].mimalloc_memory_pool().max_memory()))
import bulldozer.cli.main
sys.argv = ["bulldozer", *sys.argv[1:]]
bulldozer.cli.main.main()
"""


def _cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BULLDOZER_HOME": str(home), **(env or {})},
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("cli-process")
    create_sample_warehouse(home, rows=2_000)
    return home


def test_a_local_run_does_without_pandas(home: Path) -> None:
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    done = _cli(home, "run", str(spec), "-q")
    assert done.returncode == 0, done.stderr
    assert "IMPORTED []" in done.stdout
    assert "2,000 rows" in done.stdout
    assert "GC True BLAS 1 PLUGINS __all__" in done.stdout  # off while the run set up, on again from its load


#: the CLI's main, then (on stderr, as the interpreter exits) the rich modules it imported
_RICH = """
import atexit, sys
atexit.register(lambda: print("RICH", sorted(m for m in sys.modules if m.split(".")[0] == "rich"), file=sys.stderr))
import bulldozer.cli.main
sys.argv = ["bulldozer", *sys.argv[1:]]
bulldozer.cli.main.main()
"""


def test_a_run_asked_for_json_imports_no_rich(home: Path) -> None:
    """rich's consoles are made when a command first prints through them (cli.common,
    cli.consoles), and help texts are escaped without rich (cli.main.escape): a run asked
    for JSON, which prints its record without rich, starts without importing it (24-25 ms),
    and one that prints its lines prints them through it as ever."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "BULLDOZER_HOME": str(home)}
        done = subprocess.run([sys.executable, "-c", _RICH, "run", str(spec), *args], capture_output=True, text=True,
                              timeout=300, env=env, cwd=REPO)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    as_json = run("--json", "-q")
    assert json.loads(as_json.stdout)["rows"] == 2_000
    assert "RICH []" in as_json.stderr, as_json.stderr
    lines = run("-q")
    assert "2,000 rows" in lines.stdout and "✓" in lines.stdout
    assert "'rich.console'" in lines.stderr, lines.stderr


def test_a_run_builds_only_the_pyiceberg_models_it_uses(home: Path) -> None:
    """pyiceberg's pydantic models are built when first used (process.DEFERRED_MODELS): a
    run reads its table's metadata (validated by the models it builds) and leaves the rest
    (table updates and requirements, most expressions and views) unbuilt."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    done = _cli(home, "run", str(spec), "-q")
    assert done.returncode == 0, done.stderr
    assert "2,000 rows" in done.stdout
    unbuilt = int(re.search(r"UNBUILT (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert unbuilt >= 100, done.stdout
    validated = _cli(home, "validate", str(spec))  # no run: pyiceberg never imported, nothing to build
    assert validated.returncode == 0 and "UNBUILT 0" in validated.stdout, validated.stdout


def test_the_filter_parser_is_loaded_only_for_a_filter(home: Path) -> None:
    """pyiceberg's string-filter parser (a pyparsing grammar built at import) is deferred
    (process.DEFERRED): a run without a filter never executes it (the test above: no
    pyparsing), and a run with one loads it at first use and filters."""
    spec = home / "filtered.yaml"
    text = TEMPLATE.replace("  value_columns:  ", "  filter: rating >= 3\n  value_columns:  ", 1)
    spec.write_text(text.replace("min_rows: 1000", "min_rows: 1").replace("alias: user_item_scores", "alias: filtered"))
    done = _cli(home, "run", str(spec), "-q")
    assert done.returncode == 0, done.stderr
    assert 'IMPORTED ["pyparsing"]' in done.stdout
    rows = int(re.search(r"([\d,]+) rows from snapshot", done.stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 0 < rows < 2_000


def test_pyicebergs_configuration_file_is_read_when_there_is_one(home: Path, tmp_path: Path) -> None:
    """strictyaml is deferred too (process.DEFERRED): only pyiceberg's configuration file
    needs it. Without one a run never executes it (the first test: a -q run imports neither
    it nor rich's progress bar); with one, pyiceberg reads the file as ever."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    (tmp_path / ".pyiceberg.yaml").write_text("max-workers: 3\n")
    done = _cli(home, "run", str(spec), "-q", env={"PYICEBERG_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert 'IMPORTED ["strictyaml.parser"]' in done.stdout
    (tmp_path / ".pyiceberg.yaml").write_text("max-workers: [not, a, number\n")
    broken = _cli(home, "run", str(spec), "-q", env={"PYICEBERG_HOME": str(tmp_path)})
    assert broken.returncode != 0  # the file was parsed: strictyaml refused it
    said = broken.stderr.strip().splitlines()
    assert len(said) == 1 and "pyiceberg's own configuration" in said[0], broken.stderr  # in one line
    assert "does not parse" in said[0] and "max-workers: [not, a, number" in said[0], said


def test_a_run_succeeds_whatever_the_encoding_of_its_output(home: Path) -> None:
    """Under a legacy locale (or PYTHONIOENCODING=ascii) a run that had flipped its alias
    printed its ✓ line, raised UnicodeEncodeError and exited 1 with a traceback: a scheduler
    marked the successful run failed and ran it again. What the encoding lacks is written as
    an escape, and a failure is still its one line."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    for encoding in ("ascii", "latin-1"):

        def cli(*args: str, encoding: str = encoding) -> subprocess.CompletedProcess[str]:
            env = {**os.environ, "BULLDOZER_HOME": str(home), "PYTHONIOENCODING": encoding}
            return subprocess.run(
                [sys.executable, "-m", "bulldozer.cli.main", *args],
                capture_output=True,
                encoding=encoding,
                timeout=300,
                env=env,
            )

        done = cli("run", str(spec), "-q")
        assert done.returncode == 0, done.stderr
        assert "\\u2713 user_item_scores \\u2192 user_item_scores__v" in done.stdout, done.stdout
        missing = cli("run", str(home / "n\u00e9ant\u2192.yaml"))
        said = missing.stderr.strip().splitlines()
        assert missing.returncode == 2 and len(said) == 1 and "\\u2192.yaml" in said[0], missing.stderr


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_run_started_without_a_standard_stream_runs(home: Path, closed: int) -> None:
    """Started with ``2>&-`` (a scheduler or a shell script closing what it does not read),
    Python left ``sys.stderr`` None and the run failed before it read a row, saying nothing;
    the next file opened took the free descriptor. The entry point opens the null device
    there first."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    entry = "from bulldozer.cli.entry import main; main()"
    done = subprocess.run(
        [sys.executable, "-P", "-c", entry, "run", str(spec), "-q", "--json"],
        capture_output=closed != 1, text=True, timeout=300, preexec_fn=lambda: os.close(closed),
        env={**os.environ, "BULLDOZER_HOME": str(home)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if closed != 1:
        assert json.loads(done.stdout)["outcome"] == "succeeded"


def test_a_run_whose_output_cannot_be_written_exits_as_its_run_ended(home: Path) -> None:
    """Its output to a full disk (a scheduler's log file, say), a run that had flipped its
    alias exited 1, which the README promises only when the alias did not move: a scheduler
    ran it again. It exits as the run ended and says, on stderr, what was lost."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    for args in (["-q"], ["--json"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-P", "-m", "bulldozer.cli.main", "run", str(spec), *args],
                stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                env={**os.environ, "BULLDOZER_HOME": str(home)},
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        said = done.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("warning: user_item_scores → user_item_scores__v"), said
        assert said[0].endswith("is live, but this command could not write its output (No space left on device)")


@pytest.mark.parametrize("reader", ["none", "one line of both"])
def test_a_run_whose_reader_goes_away_runs_to_its_end(home: Path, reader: str) -> None:
    """``bulldozer run SPEC 2>&1 | head -1``: rich ended the process with exit 1 at the
    first line written after the reader left, so the run stopped at its second stage (the
    alias never moved), and one whose ``✓`` line met a closed pipe after the flip exited 1
    as if it had failed. The run now goes to its end; its exit code is the run's."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    from tests.integration.test_run import _cli as command

    before = {n["name"] for n in json.loads(command(["namespaces", "--json"], home).stdout)}
    read, write = os.pipe()
    done = subprocess.Popen(
        [sys.executable, "-P", "-m", "bulldozer.cli.main", "run", str(spec)],
        stdout=write, stderr=write, env={**os.environ, "BULLDOZER_HOME": str(home)},
    )  # fmt: skip
    os.close(write)
    if reader == "one line of both":
        with os.fdopen(read, "rb") as pipe:
            assert pipe.readline().startswith(b"\xc2\xb7 schema")  # "· schema", then the reader leaves
    else:
        os.close(read)
    assert done.wait(timeout=300) == 0
    (made,) = [n for n in json.loads(command(["namespaces", "--json"], home).stdout) if n["name"] not in before]
    assert made["state"] == "ACTIVE"


def test_other_commands_collect_from_the_start_and_a_failed_run_collects_again(home: Path, tmp_path: Path) -> None:
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    validated = _cli(home, "validate", str(spec))
    assert validated.returncode == 0, validated.stderr
    assert "GC True" in validated.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text(TEMPLATE.replace("sample.user_item_scores  #", "sample.no_such_table  #"))
    failed = _cli(home, "run", str(broken), "-q")
    assert failed.returncode != 0 and "no_such_table" in failed.stderr
    assert "GC True" in failed.stdout


def test_pydantic_plugins_stay_off_unless_the_environment_chose(home: Path) -> None:
    """The CLI turns pydantic's plugin discovery off (it scans every installed distribution's
    entry points, and Bulldozer uses no plugin); an operator's own setting stands."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    plain = _cli(home, "validate", str(spec), env={"PYDANTIC_DISABLE_PLUGINS": ""})
    chosen = _cli(home, "validate", str(spec), env={"PYDANTIC_DISABLE_PLUGINS": "logfire"})
    assert plain.returncode == 0 and chosen.returncode == 0, plain.stderr + chosen.stderr
    assert "PLUGINS __all__" in plain.stdout  # unset (empty) counts as unset for pydantic too
    assert "PLUGINS logfire" in chosen.stdout


def test_arrows_own_allocations_come_from_jemalloc_unless_the_environment_chose(home: Path) -> None:
    """Arrow's C++ allocates from the pool ``ARROW_DEFAULT_MEMORY_POOL`` names as pyarrow is
    imported, whatever ``pa.set_memory_pool`` says later (the Parquet reader's buffers among
    them): the CLI names jemalloc, so mimalloc serves nothing; an operator's choice stands."""
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    plain = _cli(home, "run", str(spec), "-q", env={"ARROW_DEFAULT_MEMORY_POOL": ""})
    chosen = _cli(home, "run", str(spec), "-q", env={"ARROW_DEFAULT_MEMORY_POOL": "system"})
    assert plain.returncode == 0 and chosen.returncode == 0, plain.stderr + chosen.stderr
    assert "ARROW jemalloc 0\n" in plain.stdout, plain.stdout
    assert "ARROW system 0\n" in chosen.stdout, chosen.stdout


def test_a_query_run_exits_without_a_leak_report(home: Path) -> None:
    spec = home / "query.yaml"
    query = '    query: "SELECT user_id, item_id, locale, rating, price, profile FROM sample.user_item_scores"'
    text = TEMPLATE.replace("    table: sample.user_item_scores  # namespace.table ...", query)
    text = re.sub(
        r"  value_columns:.*?\n(?=  renames:)", "  value_columns: [rating, price, profile]\n", text, flags=re.S
    )
    spec.write_text(text.replace("      nickname: 0.5", "      price: 0.5"))
    done = _cli(home, "run", str(spec), "-q")
    assert done.returncode == 0, done.stderr
    assert 'IMPORTED ["duckdb"]' in done.stdout  # DuckDB ran the query; pandas was not needed
    assert "leak" not in done.stderr


def test_commands_run_in_process_leave_the_interpreter_alone() -> None:
    assert not process.owned()
    assert process.without_pandas() is False
    assert not any(type(finder).__name__ in ("_NoPandas", "_Deferred") for finder in sys.meta_path)


def test_embedded_dals_share_the_days_log_and_a_failed_start_says_its_own_reason(tmp_path: Path) -> None:
    """Each command's embedded DAL appends to the day's log file (not one file per command),
    and a DAL that cannot start is reported with what it logged, not what others did."""
    home = tmp_path / "home"
    create_sample_warehouse(home, rows=100)
    (home / "kv").write_text("not a store")
    spec = tmp_path / "job.yaml"
    spec.write_text(TEMPLATE)
    for _ in range(2):
        failed = _cli(home, "run", str(spec), "-q")
        assert failed.returncode == 1
        assert failed.stderr.count("cannot open the embedded store") == 1, failed.stderr
        assert f"{home / 'kv'}: it is a file, not a folder" in failed.stderr  # mkdir said "File exists"
        assert "the embedded DAL did not start" in failed.stderr and "Traceback" not in failed.stderr
    (log,) = (home / "logs").glob("dal-*.log")
    assert log.read_text().count("cannot open the embedded store") == 2


def _empty_cache_env(cache: Path) -> dict[str, str]:
    """An environment whose bytecode cache is ``cache`` (new, empty) and may be written."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def _cached_sources(cache: Path) -> set[str]:
    """The source files ``cache`` (a PYTHONPYCACHEPREFIX tree) holds compiled code of."""
    return {"/" + str(pyc.parent.relative_to(cache) / pyc.name.split(".")[0]) + ".py" for pyc in cache.rglob("*.pyc")}


def test_a_child_compiles_a_runs_modules_ahead_into_an_empty_bytecode_cache(tmp_path: Path) -> None:
    """``process.compile_ahead``: with an empty cache a run starts a child that compiles the
    run's modules (``RUN_MODULES``), and with a filled one, another command, a cache that
    may not be written (``PYTHONDONTWRITEBYTECODE``) or cannot be (its folder would be under
    a file), nothing is started."""
    cache = tmp_path / "pycache"
    probe = """
import os, sys
from bulldozer.cli import process
pid = process.compile_ahead(sys.argv[1:])
print("PID", pid)
if pid is not None:
    _, status = os.waitpid(pid, 0)
    print("STATUS", os.waitstatus_to_exitcode(status))
"""

    def ahead(*argv: str, env: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "PID None" in ahead("validate", "job.yaml", env=_empty_cache_env(cache))  # not a run
    assert "PID None" in ahead("run", "job.yaml", env={**_empty_cache_env(cache), "PYTHONDONTWRITEBYTECODE": "1"})
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert "PID None" in ahead("run", "job.yaml", env=_empty_cache_env(a_file / "pycache"))  # no cache can be written
    last = process.module_source(process.run_modules()[-1])
    assert last not in _cached_sources(cache)  # the probe's own modules only
    first = ahead("--profile", "dev", "run", "job.yaml", env=_empty_cache_env(cache))
    assert "PID None" not in first and "STATUS 0" in first
    sources = [process.module_source(name) for name in process.run_modules()]
    assert len(sources) > 300 and sum(s is None for s in sources) < 0.05 * len(sources)
    listed = {s for s in sources if s is not None}
    assert listed <= _cached_sources(cache)  # every module the list names, compiled by the child
    assert "PID None" in ahead("run", "job.yaml", env=_empty_cache_env(cache))  # the cache is filled now


def test_a_run_with_an_empty_bytecode_cache_compiles_ahead_and_ends_as_usual(tmp_path: Path) -> None:
    """Through the ``bulldozer`` entry point, with a new cache: the run succeeds with its whole
    output (the child's goes elsewhere), and the cache holds the run's modules afterwards."""
    home = tmp_path / "home"
    create_sample_warehouse(home, rows=2_000)
    spec = home / "job.yaml"
    spec.write_text(TEMPLATE)
    cache = tmp_path / "pycache"
    done = subprocess.run(
        [sys.executable, "-m", "bulldozer.cli.entry", "run", str(spec), "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_empty_cache_env(cache), "BULLDOZER_HOME": str(home)},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 2_000
    names = process.run_modules()
    assert process.module_source(names[-1]) in _cached_sources(cache)


def test_the_run_modules_list_still_covers_a_run() -> None:
    """RUN_MODULES, written by scripts/gen_run_modules.py, against the modules a run of the
    template imports now: a few may differ (a dependency's release), more means regenerate."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_run_modules
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert gen_run_modules.drift(gen_run_modules.record(), process.run_modules()) is None


def _against_a_dal(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run in its own process with the address of a DAL (its Python data plane)."""
    from tests.integration.test_kv_server import _free_port, _start

    port = _free_port()
    server = _start(tmp_path / "store", port, "--data-plane", "python")
    try:
        return subprocess.run(
            [sys.executable, "-c", script, f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60, cwd=REPO
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


#: a command-line process (``claim``) whose first write batch is SIGTERMed as gRPC makes its
#: call: after gRPC counted the call for its polling thread and before it started that
#: thread; it prints what its stop and its channel's close took
_STOPPED_AS_GRPC_MAKES_A_CALL = """
import os, signal, sys, time
import grpc._channel
from bulldozer.cli import process
from bulldozer.kv import KvClient
from bulldozer.names import new_version_name

process.claim()
start_polling = grpc._channel._run_channel_spin_thread

def interrupted_here(state):
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next line, inside gRPC's making of the call
    time.sleep(0)
    start_polling(state)

grpc._channel._run_channel_spin_thread = interrupted_here
client = KvClient(sys.argv[1], timeout=30)
name = new_version_name("stopped")
client.create_namespace(name, "stopped")
try:
    with client.writer(name, batch_records=10, batch_bytes=1 << 20, in_flight=4) as writer:
        writer.add(b"k", b"v")
        writer.flush()
        time.sleep(30)
except KeyboardInterrupt as exc:
    print("stopped:", exc, flush=True)
began = time.monotonic()
client.close()
print(f"closed in {time.monotonic() - began:.1f} s", flush=True)
"""


def test_a_stop_as_grpc_makes_a_call_is_raised_once_it_is_made_and_the_client_closes(tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C, SIGHUP, the time limit) is raised in the main thread wherever it
    is. Landing inside gRPC's making of a call, between its counting the call for its
    polling thread and its starting that thread, it left a call no thread would complete:
    the run then hung for ever in its clean-up, waiting for that batch's acknowledgement or
    for the channel to close (3 runs of 30 SIGTERMed mid-load hung so). The making of a call
    is now shielded (``bulldozer.interrupts``): the stop is raised once the call is made, the
    writer cancels its batches in flight, and the channel closes at once."""
    done = _against_a_dal(_STOPPED_AS_GRPC_MAKES_A_CALL, tmp_path)
    said = done.stdout.splitlines()
    assert said[0] == "stopped: the process got SIGTERM", done.stdout + done.stderr
    closed = re.fullmatch(r"closed in (\d+\.\d) s", said[1])
    assert closed is not None and float(closed.group(1)) < 2, done.stdout + done.stderr
    assert "did not close" not in done.stderr, done.stderr


#: a command-line process SIGTERMed in a blocking call (DescribeNamespace) once gRPC made
#: the call and before it waited for its answer; it prints where the stop was raised and
#: whether its channel then closed
_STOPPED_AS_GRPC_MAKES_A_BLOCKING_CALL = """
import os, signal, sys, threading, time, traceback
from bulldozer.cli import process
from bulldozer.kv import KvClient

process.claim()
client = KvClient(sys.argv[1], timeout=30)
describe = client.transport.namespaces.DescribeNamespace
channel = describe._channel

class InterruptedOnceMade:
    def __getattr__(self, name):
        return getattr(channel, name)

    def segregated_call(self, *args, **kwargs):
        call = channel.segregated_call(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next line: the call made, not waited for
        time.sleep(0)
        return call

describe._channel = InterruptedOnceMade()
try:
    client.describe("nothing__v20260101000000_000000")
except KeyboardInterrupt as exc:
    print("stopped:", exc, [frame.name for frame in traceback.extract_tb(exc.__traceback__)][-3], flush=True)
closed = threading.Event()
threading.Thread(target=lambda: (client.close(), closed.set()), daemon=True).start()
print("closed" if closed.wait(10) else "did not close in 10 s", flush=True)
"""


def test_a_stop_in_a_blocking_call_once_grpc_made_it_leaves_the_client_closing_at_once(tmp_path: Path) -> None:
    """A blocking call (the stages' describes, seals and flips) is made and waited for in
    one gRPC function, on a completion queue of the call's own that no other thread polls:
    a stop landing between the two leaves a made call nobody waits for. The channel still
    closes at once (unlike a future's call, counted for the polling thread: the test above),
    so these calls need no shield, which would hold the stop until the answer came."""
    done = _against_a_dal(_STOPPED_AS_GRPC_MAKES_A_BLOCKING_CALL, tmp_path)
    assert done.stdout.splitlines() == ["stopped: the process got SIGTERM segregated_call", "closed"], (
        done.stdout + done.stderr
    )


@pytest.mark.parametrize(
    ("command", "ready", "code", "said"),
    [
        (["ui", "--port", "0"], "console: http://", 129, "error: terminated (SIGHUP: the terminal it ran in hung up)"),
        (["loader", "serve"], "loader ready for", 0, "loader stopped after 0 command(s)"),
    ],
    ids=["ui", "loader-serve"],
)
def test_a_long_running_command_whose_terminal_hangs_up_stops_gracefully(
    tmp_path: Path, command: list[str], ready: str, code: int, said: str
) -> None:
    """SIGHUP (the terminal closed) reached ``bulldozer ui`` inside uvicorn's event loop,
    which logged a traceback; a foreground ``loader serve`` died without taking its socket
    and registry entry away. Each now stops as on SIGTERM."""
    import select
    import signal

    env = {**os.environ, "BULLDOZER_HOME": str(tmp_path / "h"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", *command],
        stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        shown = ""
        deadline = time.monotonic() + 60
        while ready not in shown and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 1)[0]:
                shown += proc.stderr.readline()
        assert ready in shown, shown
        if (console := re.search(r"http://[^ ]+/", shown)) is not None:  # the page answers: uvicorn's loop runs
            import urllib.request

            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(console.group(0), timeout=5):
                        break
                except OSError:
                    time.sleep(0.1)
        proc.send_signal(signal.SIGHUP)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:  # the test failed before it stopped: nothing outlives it
            proc.kill()
            proc.wait()
    assert proc.returncode == code, shown + rest
    assert said in rest and "Traceback" not in rest, rest
    assert not (tmp_path / "h" / "loader" / "loader.sock").exists()
