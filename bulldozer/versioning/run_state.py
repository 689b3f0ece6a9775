"""The typed state of a run, kept in its version's labels in the DAL.

One model, read and written here only: the runner writes it stage by stage, and a resumed
run, the scheduler's stages, ``bulldozer runs``, ``plan`` and ``jobs`` read it back. The
labels (``bulldozer.*``) are its storage format, not an API: nothing else parses them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, TypeVar

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from bulldozer.errors import NamespaceStateError
from bulldozer.kv.types import NamespaceRecord, State, utcnow

if TYPE_CHECKING:
    from pydantic import TypeAdapter

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "ALIVE_WITHIN",
    "BASE_COPIED_LABEL",
    "HEARTBEAT_LABEL",
    "LEDGER_LABEL",
    "LOADED_LABEL",
    "MADE_IN",
    "RUN_KEY_LABEL",
    "RUN_LABEL",
    "SPEC_LABEL",
    "STAGE_LABEL",
    "Beat",
    "DeltaSummary",
    "GateSummary",
    "Heartbeat",
    "Loaded",
    "RunRecord",
    "ShadowReadSummary",
    "SplitLedger",
    "base_copied",
    "beat_of",
    "being_made",
    "being_made_by",
    "last_sign_of_life",
    "ledger_of",
    "loaded_of",
    "run_key_of",
    "run_record_of",
]

#: The run record (JSON of :class:`RunRecord`).
RUN_LABEL = "bulldozer.run"
#: Splits already loaded and acknowledged: ``{split id: [rows, digest, bytes, null counts]}``.
LEDGER_LABEL = "bulldozer.ledger"
#: The sha256 of the spec text the run loaded.
SPEC_LABEL = "bulldozer.spec_sha256"
#: The stage the run is at (load, verify, flip, done, failed).
STAGE_LABEL = "bulldozer.stage"
#: What the load stage measured (:class:`Loaded`), for a verify stage in another process.
LOADED_LABEL = "bulldozer.loaded"
#: The scheduler's key of the run (e.g. Airflow's DAG run id), so a retried load stage
#: finds and resumes the version its first attempt created.
RUN_KEY_LABEL = "bulldozer.run_key"
#: A delta version's base, written once the DAL has made the version from it (its create
#: call returned): without it, the run was killed while the base was copied or layered, and
#: the version holds part of the base at most.
BASE_COPIED_LABEL = "bulldozer.base_copied"
#: The last heartbeat of the run making the version (JSON of :class:`Beat`: when, which process).
#: A version the run is still making, ``being_made``, is not dropped by retention nor resumed.
HEARTBEAT_LABEL = "bulldozer.heartbeat"


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


@with_config(ConfigDict(extra="allow"))
class ShadowReadSummary(TypedDict):
    """What a run record keeps of its shadow read (``load.shadow_read.ShadowReadReport.as_dict``,
    which holds more): the fields its readers use, checked as a record is read."""

    sampled: int
    missing_fraction: float
    added_fraction: float
    changed_fraction: float


@with_config(ConfigDict(extra="allow"))
class DeltaSummary(TypedDict):
    """What a run record keeps of a delta run (``load.delta.DeltaChanges.summary``, which
    holds more): the fields its readers use, checked as a record is read."""

    base: str
    files_removed: int
    files_added: int
    #: files both snapshots keep whose deletes changed, read on both sides (older records lack it)
    files_reread: NotRequired[int]
    rows_read: int
    #: base records a delta took by key, not from files (older records lack it)
    deleted_by_key: NotRequired[int]
    added: int
    changed: int
    deleted: int


class GateSummary(TypedDict):
    """One quality gate a run record keeps (``load.gates.GateResult.as_dict``), checked as a
    record is read: the console shows each field."""

    gate: str
    passed: bool
    detail: str


#: a nested part of a run record that a run did not fill (``{}``)
_Nothing = Annotated[dict[str, Any], Field(max_length=0)]


@dataclass
class RunRecord:
    """What one run did; kept with the version and shown by ``bulldozer runs``."""

    run_id: str
    job: str
    alias: str
    version: str = ""
    previous: str = ""
    engine: str = "local"
    spec_sha256: str = ""
    snapshot_id: int = 0
    #: every table read, at its pinned snapshot (one for a table source)
    snapshots: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    digest: str = ""
    gates: list[GateSummary] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: seconds of the load stage spent waiting for the engine to be ready (Spark: its driver
    #: and its executors' Python workers, started ahead while the run read the schema; 0 for local)
    engine_start: float = 0.0
    outcome: str = "running"
    error: str = ""
    started: str = ""
    finished: str = ""
    resumed: bool = False
    retention_dropped: list[str] = field(default_factory=list)
    #: set when retention failed after the flip: the version is live, old ones were not dropped
    retention_error: str = ""
    #: the stage that failed (a failed run)
    failed_stage: str = ""
    #: the version's schema generation (one more than the previous version's at a breaking change)
    schema_generation: int = 1
    #: the changes that break readers of the previous generation (a run with --allow-breaking)
    breaking_changes: list[str] = field(default_factory=list)
    #: "full" (every row written) or "delta" (the base version plus the changed files' rows)
    mode: str = "full"
    #: why a run the spec asked to be a delta (mode delta or auto) wrote the whole table
    full_reason: str = ""
    #: a delta run: its base version and snapshot, the files and rows it read, the puts and deletes
    delta: DeltaSummary | _Nothing = field(default_factory=dict)
    #: the source table's UUID (a table replaced under the same name gets a new one)
    table_uuid: str = ""
    #: the shadow read before the flip (``load.shadow_read.ShadowReadReport.as_dict``), if one ran
    shadow_read: ShadowReadSummary | _Nothing = field(default_factory=dict)
    #: the job the alias served before this run took it over (``bulldozer run --take-over``)
    taken_over_from: str = ""
    #: the spec's ``key_value_dal.retention`` (``keep_versions``, ``grace_seconds``): ``bulldozer
    #: gc`` applies the live version's to its alias, as the job's own runs do
    retention: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return _compact(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """The record ``text`` holds, each field of its type (a ValueError otherwise);
        fields this release does not know are left out."""
        record: RunRecord = run_record_adapter().validate_json(text)
        return record

    @property
    def load_seconds(self) -> float:
        return float(self.timings.get("load", 0.0))


@dataclass(frozen=True)
class Loaded:
    """What the load stage measured: rows, digest and null counts per column."""

    rows: int
    digest: int
    null_counts: dict[str, int]

    def to_json(self) -> str:
        return _compact({"rows": self.rows, "digest": self.digest, "null_counts": self.null_counts})

    @classmethod
    def from_json(cls, text: str) -> Loaded:
        data = json.loads(text)
        return cls(int(data["rows"]), int(data["digest"]), {k: int(v) for k, v in data["null_counts"].items()})


@functools.cache
def run_record_adapter() -> TypeAdapter[RunRecord]:
    """What reads a run record, built on first use (about 20 ms: a command that reads none
    does not pay it; a warm loader builds it before it forks its children)."""
    from pydantic import TypeAdapter

    return TypeAdapter(RunRecord)


def _label(version: NamespaceRecord, label: str, parse: Callable[[str], T]) -> T | None:
    """What ``version``'s ``label`` records, or None when it records nothing this release
    reads — said in a warning. Any client the DAL lets write a version's labels (an older
    or newer release, another tool) could leave one that does not parse; read as it was,
    one such label on a live version failed ``gc`` of every alias with a traceback, and
    every later run of its job with ``run failed: JSONDecodeError``."""
    text = version.labels.get(label)
    if not text:
        return None
    try:
        return parse(text)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        errors = getattr(exc, "errors", None)  # pydantic's: where and what, without its boilerplate
        said = (
            "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the record'}: {e['msg']}" for e in errors()[:3])
            if callable(errors)
            else " ".join(str(exc).split())[:200]
        )
        log.warning("%s: its label %s is not a record this release reads; left out: %s", version.name, label, said)
        return None


#: the error of a run whose version was dropped before the run could record its end
DROPPED_UNFINISHED = "its version was dropped before the run finished (the run was killed, or the version dropped)"


def run_record_of(version: NamespaceRecord, now: datetime | None = None) -> RunRecord | None:
    """The run record a version keeps, or None (a version no run made). A run that never
    recorded its end says so instead of "running": ``failed`` once its version was dropped
    (killed, then its version dropped by gc; or the version dropped under it — a dropped
    version keeps no labels changed), ``stopped`` once its run is no longer alive
    (``being_made``: killed, or its machine lost) — unless a scheduler runs it (a run key),
    whose run waits between its tasks and retries."""
    run = _label(version, RUN_LABEL, RunRecord.from_json)
    if run is None or run.outcome != "running":
        return run
    if version.state == State.DROPPED:
        run.outcome, run.error = "failed", run.error or DROPPED_UNFINISHED
    elif version.state in MADE_IN and not run_key_of(version) and not being_made(version, now or utcnow()):
        # (a scheduler's run is between its tasks, or waits for a retry: the scheduler says)
        beat = beat_of(version)
        if beat is not None:  # a version made before heartbeats says nothing either way
            run.outcome = "stopped"
            since = f"its run has not been heard from since {beat.at:%Y-%m-%d %H:%M:%S} UTC"
            if version.state == State.SEALED:
                run.error = f"{since} (killed before its flip?)"
            else:
                run.error = f"{since} (killed?); `bulldozer run SPEC --resume {version.name}` goes on with it"
    return run


def loaded_of(version: NamespaceRecord) -> Loaded | None:
    """What the version's load stage measured, or None before it finished."""
    return _label(version, LOADED_LABEL, Loaded.from_json)


def ledger_of(version: NamespaceRecord) -> dict[str, Any]:
    """The splits the version holds already (see LEDGER_LABEL)."""
    text = version.labels.get(LEDGER_LABEL)
    if not text:
        return {}
    try:
        ledger = json.loads(text)
    except ValueError:
        ledger = None
    if not (isinstance(ledger, dict) and all(isinstance(v, list) for v in ledger.values())):
        raise NamespaceStateError(
            f"{version.name}'s record of the splits it holds ({LEDGER_LABEL}) does not parse: which of its records "
            "are whole is not known, so it cannot be resumed; start a new run"
        )
    return ledger


def ledger_label(ledger: dict[str, Any]) -> dict[str, str]:
    """The labels that record ``ledger``."""
    return {LEDGER_LABEL: _compact(ledger)}


#: the least time between two writes of a load's split ledger (``SplitLedger``)
LEDGER_EVERY_SECONDS = 0.25


class SplitLedger:
    """A LOADING version's split ledger, kept as its splits are acknowledged: ``add`` notes
    a split and writes the ledger (``write``: its labels, a DAL write that is made durable)
    unless it was written less than ``every`` seconds ago; ``flush`` writes what is left when
    the load ends. A split the ledger names is in the store; one acknowledged since the last
    write is read and sent again by a resumed run, as one still being sent is.

    Written for every split, the ledger — all of it each time — cost a table of many small
    files a DAL write, an fsync and a growing JSON per file: a 17 M-row full run of 588 files
    made 591 writes, 3.5–6.6 s on the ledger's thread (9.9 MB of JSON) beside a 10–12 s load,
    and the DAL's CPU for them competed with the load's. Written at most every 0.25 s: 29–31
    writes, 0.23–0.61 s; the run 1.0–2.2 s faster and 1.9–3.1 s less CPU (three pairs side
    by side, 14.1–15.4 s against 15.7–17.1 s)."""

    def __init__(
        self, write: Callable[[dict[str, str]], object], done: dict[str, Any], every: float = LEDGER_EVERY_SECONDS
    ) -> None:
        self._write, self._every = write, every
        self._state = dict(done)
        self._lock = threading.Lock()
        self._written_at = float("-inf")
        self._pending = False

    def add(self, split_id: str, entry: list[Any]) -> None:
        with self._lock:
            self._state[split_id] = entry
            self._pending = True
            if time.monotonic() - self._written_at >= self._every:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._write(ledger_label(self._state))
            self._pending = False
            self._written_at = time.monotonic()


def base_copied(version: NamespaceRecord) -> bool:
    """Whether ``version`` holds all of its base, if it has one (``BASE_COPIED_LABEL``)."""
    return not version.base or version.labels.get(BASE_COPIED_LABEL) == version.base


def run_key_of(version: NamespaceRecord) -> str:
    return version.labels.get(RUN_KEY_LABEL, "")


#: how often a run writes its version's heartbeat (``Heartbeat``)
HEARTBEAT_EVERY_SECONDS = 30.0
#: a version whose run wrote its heartbeat this recently is being made now (``being_made``):
#: four beats. Taking a live run for a dead one fails that run (its version is dropped, or
#: resumed beside it), never makes a wrong version live.
ALIVE_WITHIN = timedelta(minutes=2)
#: how long a run's end waits for its heartbeat's last beat (``Heartbeat.stop``)
LAST_BEAT_WAIT_SECONDS = 5.0
#: the states a run makes a version through (LOADING to SEALED, before its flip)
MADE_IN = frozenset({State.LOADING, State.SEALING, State.SEALED})


def _pid_namespace() -> str:
    """This process's PID namespace (Linux), so a pid is compared only within its own."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _boot_id() -> str:
    """This boot of the machine (Linux's random boot id): a pid written before the machine
    restarted names no process of this boot, though the host and the PID namespace's name
    are the same again."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Beat:
    """One heartbeat of a run: when, and which process wrote it."""

    at: datetime
    host: str = ""
    pid_namespace: str = ""
    pid: int = 0
    #: the run's last beat, written as it ended (its process may live on: a scheduler's worker)
    ended: bool = False
    #: the machine's boot it was written in (``_boot_id``; empty: not known)
    boot: str = ""

    @classmethod
    def now(cls, ended: bool = False, clock: Callable[[], datetime] = utcnow) -> Beat:
        """A beat of this process at ``clock``'s time (a run's: its DAL's, ``KvClient.now``)."""
        return cls(clock(), socket.gethostname(), _pid_namespace(), os.getpid(), ended, _boot_id())

    def to_json(self) -> str:
        data: dict[str, object] = {"at": self.at.isoformat(), "host": self.host, "pid_ns": self.pid_namespace}
        data["pid"] = self.pid
        if self.boot:
            data["boot"] = self.boot
        if self.ended:
            data["ended"] = True
        return _compact(data)

    @classmethod
    def from_json(cls, text: str) -> Beat | None:
        """The beat ``text`` records; None when it records none (not one this release wrote)."""
        try:
            data = json.loads(text)
            at = datetime.fromisoformat(data["at"])
            if at.tzinfo is None:
                return None
            host, namespace, pid = str(data.get("host", "")), str(data.get("pid_ns", "")), int(data.get("pid", 0))
            return cls(at, host, namespace, pid, data.get("ended") is True, str(data.get("boot", "")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def here(self) -> bool:
        """Whether it was written on this machine, in this PID namespace (Linux)."""
        namespace = _pid_namespace()
        return bool(self.pid and namespace) and self.host == socket.gethostname() and self.pid_namespace == namespace

    def process_gone(self) -> bool:
        """Whether the process that wrote it is known to have ended: it ran ``here`` and the
        machine has restarted since (a run resumed right after a crash found its own pid
        taken by a process of the new boot, and was refused as "being made" for minutes), or
        its pid is free or a zombie's. Unknown elsewhere (False)."""
        if not self.here():
            return False
        if self.boot and self.boot != _boot_id():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # another user's process has it: alive
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return True  # gone between the two looks
        return stat.rpartition(")")[2].split()[:1] == ["Z"]  # exited, not yet reaped


#: the versions a run in this process beats on now (``Heartbeat``), with how many runs
_BEATING: dict[str, int] = {}
_BEATING_LOCK = threading.Lock()


class Heartbeat:
    """A run's heartbeat on its version: from ``start`` to ``stop``, a thread of its own
    writes a ``Beat`` (``HEARTBEAT_LABEL``, through ``write``: its labels) at once and every
    ``every`` seconds, and a last one marked ``ended`` as it stops, so that retention,
    ``gc`` and a resume can tell a version a run is making — a Spark load of a day, a seal
    measuring billions of records — from one a run left (``being_made``). A beat's time is
    ``clock``'s: a run's is its DAL's (``KvClient.now``), the clock its readers read its age
    on. A write that fails is logged and tried again at the next beat; the run's own errors
    say what went wrong."""

    def __init__(
        self,
        version: str,
        write: Callable[[dict[str, str]], object],
        every: float = HEARTBEAT_EVERY_SECONDS,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.version, self._write, self._every, self._clock = version, write, every, clock
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: the last beat is the caller's to write (``last_beat``), not the thread's
        self._handed_over = False

    def start(self) -> Heartbeat:
        if self._thread is None:
            with _BEATING_LOCK:
                _BEATING[self.version] = _BEATING.get(self.version, 0) + 1
            self._thread = threading.Thread(target=self._beat, name="run-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait: float = LAST_BEAT_WAIT_SECONDS) -> None:
        """Stop beating (the last beat says the run ended); returns once it is written, or
        after ``wait`` seconds (a DAL that hangs; the run's own call says so). A late beat
        changes only its label: the DAL writes one version's labels one request at a time,
        and a FAILED or live version's heartbeat is not read."""
        self.end()
        self.wait_ended(wait)

    def end(self) -> None:
        """Have the last beat written, on the heartbeat's own thread, without waiting for it
        (``wait_ended``): a run failed by an unreachable store records its failure meanwhile,
        both meeting the same outage at once rather than one after the other."""
        if self._thread is None or self._stopped.is_set():
            return
        self._stopped.set()
        with _BEATING_LOCK:
            left = _BEATING.pop(self.version, 1) - 1
            if left:
                _BEATING[self.version] = left

    def wait_ended(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the last beat ``end`` asked for."""
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, timeout))

    def last_beat(self, wait: float = LAST_BEAT_WAIT_SECONDS) -> dict[str, str]:
        """Stop beating and return the last beat's label, marked ended, for the caller to
        write with its own last labels (a finished run: with its record, one request where
        the beat and the record took two, one after the other); none when it was not beating
        or had stopped already. Returns once a beat being written is (at most ``wait``
        seconds), so that none lands after the caller's."""
        if self._thread is None or self._stopped.is_set():
            return {}
        self._handed_over = True
        self.end()
        self.wait_ended(wait)
        return {HEARTBEAT_LABEL: Beat.now(True, self._clock).to_json()}

    def _beat(self) -> None:
        while True:
            ended = self._stopped.is_set()
            if ended and self._handed_over:
                return
            try:
                self._write({HEARTBEAT_LABEL: Beat.now(ended, self._clock).to_json()})
            except Exception as exc:  # the DAL away for a moment, the version gone: the run will say
                log.debug("the run's heartbeat was not written: %s", exc)
            if ended:
                return
            self._stopped.wait(self._every)


def beat_of(version: NamespaceRecord) -> Beat | None:
    """The last heartbeat of the run making ``version``, if it wrote one."""
    text = version.labels.get(HEARTBEAT_LABEL, "")
    return Beat.from_json(text) if text else None


def _alive_beat(version: NamespaceRecord, now: datetime) -> Beat | None:
    """The last heartbeat of the run making ``version`` now, or None when no run is
    (``being_made``)."""
    if version.state not in MADE_IN:
        return None
    beat = beat_of(version)
    if beat is None or beat.ended or now - beat.at > ALIVE_WITHIN:
        return None
    if beat.here() and beat.pid == os.getpid():
        with _BEATING_LOCK:
            return beat if version.name in _BEATING else None
    return None if beat.process_gone() else beat


def being_made(version: NamespaceRecord, now: datetime) -> bool:
    """Whether a run is making ``version`` now: LOADING, SEALING or SEALED (not yet
    flipped), its run's last heartbeat not its end and at most ``ALIVE_WITHIN`` old, and its
    process not known to have ended — nor, when it is this process, to beat no more."""
    return _alive_beat(version, now) is not None


def last_sign_of_life(version: NamespaceRecord) -> datetime:
    """The later of its last state change and its run's last heartbeat."""
    beat = beat_of(version) if version.state in MADE_IN else None
    if beat is None:
        return version.state_changed
    return max(version.state_changed, beat.at)


def being_made_by(version: NamespaceRecord, now: datetime) -> str | None:
    """Who is making ``version`` now, in words (None: no run is, ``being_made``)."""
    beat = _alive_beat(version, now)
    if beat is None:
        return None
    ago = max(0, round((now - beat.at).total_seconds()))
    return f"process {beat.pid} on {beat.host} wrote its heartbeat {ago} s ago"
