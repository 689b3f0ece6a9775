"""A run's heartbeat on its version (bulldozer.versioning.run_state.Heartbeat): written at
once and then at each interval until stopped; retention never drops a version whose run
beats, and counts a killed run's grace period from its last beat."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from bulldozer.kv.backends.memory import MemoryEngine
from bulldozer.kv.server.rules import KvDal
from bulldozer.kv.types import NamespaceRecord, State, utcnow
from bulldozer.names import new_version_name
from bulldozer.versioning.retention import plan_retention
from bulldozer.versioning.run_state import ALIVE_WITHIN, HEARTBEAT_LABEL, Beat, Heartbeat, beat_of

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=utcnow().tzinfo)
DAY = timedelta(days=1)


def _version(state: State, changed_ago: timedelta, beat_ago: timedelta | None = None) -> NamespaceRecord:
    # written by a process on another machine: only its time tells whether it is alive
    labels = {HEARTBEAT_LABEL: Beat(NOW - beat_ago, "elsewhere", "pid:[1]", 4242).to_json()} if beat_ago else {}
    return NamespaceRecord(
        name=new_version_name("scores"),
        alias="scores",
        state=state,
        created=NOW - changed_ago,
        state_changed=NOW - changed_ago,
        labels=labels,
    )


def test_the_heartbeat_is_written_at_once_then_every_interval_until_stopped() -> None:
    beats: list[Beat] = []

    def write(labels: dict[str, str]) -> None:
        beat = Beat.from_json(labels[HEARTBEAT_LABEL])
        assert beat is not None and beat.pid == os.getpid()
        beats.append(beat)

    heartbeat = Heartbeat("scores__v1", write, every=0.05)
    heartbeat.start()
    time.sleep(0.02)
    assert len(beats) == 1  # a resumed run's version is alive again at once
    time.sleep(0.2)
    heartbeat.stop()
    count = len(beats)
    assert count >= 4 and [b.at for b in beats] == sorted(b.at for b in beats)
    assert [b.ended for b in beats] == [False] * (count - 1) + [True]  # the last says the run ended
    time.sleep(0.1)
    assert len(beats) == count  # stopped: the run's last word is its own


def test_the_last_beat_handed_to_the_caller_is_written_by_the_caller_alone() -> None:
    """A finished run writes its last beat with its record (``last_beat``): one request."""
    beats: list[Beat] = []

    def write(labels: dict[str, str]) -> None:
        beat = Beat.from_json(labels[HEARTBEAT_LABEL])
        assert beat is not None
        beats.append(beat)

    heartbeat = Heartbeat("scores__v1", write, every=0.05).start()
    time.sleep(0.12)
    last = heartbeat.last_beat()
    count = len(beats)
    assert count >= 2 and not any(b.ended for b in beats)
    beat = Beat.from_json(last[HEARTBEAT_LABEL])
    assert beat is not None and beat.ended and beat.pid == os.getpid() and beat.at >= beats[-1].at
    time.sleep(0.12)
    assert len(beats) == count  # the thread wrote no more, its last beat neither
    assert heartbeat.last_beat() == {}  # stopped: nothing more to hand over
    heartbeat.stop()
    assert len(beats) == count


def test_a_heartbeat_that_cannot_be_written_keeps_trying_and_never_raises() -> None:
    tries: list[int] = []

    def write(labels: dict[str, str]) -> None:
        tries.append(1)
        raise ConnectionError("the DAL is away")

    heartbeat = Heartbeat("scores__v1", write, every=0.02).start()
    time.sleep(0.15)
    heartbeat.stop()
    assert len(tries) >= 3


@pytest.mark.parametrize("state", [State.LOADING, State.SEALING, State.SEALED])
def test_a_version_whose_run_beats_is_kept_whatever_the_grace_period(state: State) -> None:
    """A Spark load of two days: its version changed state two days ago, its run beat a
    minute ago. Retention (and ``gc --grace 0s``) dropped it under the run."""
    version = _version(state, changed_ago=2 * DAY, beat_ago=timedelta(minutes=1))
    for grace in (timedelta(0), DAY):
        plan = plan_retention([version], keep_versions=2, grace_period=grace, now=NOW)
        assert (plan.keep, plan.drop) == ([version.name], []), grace


def test_a_killed_run_s_version_is_dropped_a_grace_period_after_its_last_beat() -> None:
    stale = ALIVE_WITHIN + timedelta(seconds=1)
    beat_an_hour_ago = _version(State.LOADING, changed_ago=2 * DAY, beat_ago=timedelta(hours=1))
    plan = plan_retention([beat_an_hour_ago], 2, DAY, now=NOW)
    assert plan.keep == [beat_an_hour_ago.name]  # its grace counts from its last beat
    plan = plan_retention([beat_an_hour_ago], 2, timedelta(minutes=30), now=NOW)
    assert plan.drop == [beat_an_hour_ago.name]
    quiet = _version(State.LOADING, changed_ago=2 * DAY, beat_ago=stale)
    assert plan_retention([quiet], 2, timedelta(0), now=NOW).drop == [quiet.name]
    never = _version(State.LOADING, changed_ago=2 * DAY)  # made before heartbeats: as before
    assert plan_retention([never], 2, DAY, now=NOW).drop == [never.name]


def test_a_failed_version_goes_after_its_grace_period_whatever_its_labels_say() -> None:
    failed = _version(State.FAILED, changed_ago=2 * DAY, beat_ago=timedelta(minutes=1))
    assert plan_retention([failed], 2, DAY, now=NOW).drop == [failed.name]


def test_a_heartbeat_that_is_not_a_time_counts_as_none() -> None:
    version = _version(State.LOADING, changed_ago=2 * DAY)
    version.labels[HEARTBEAT_LABEL] = "yesterday"
    assert beat_of(version) is None
    assert plan_retention([version], 2, DAY, now=NOW).drop == [version.name]


def test_labels_written_at_once_are_all_kept() -> None:
    """A run's split ledger and its heartbeat write one version's labels at the same moment:
    the DAL read, merged and wrote each back on its own, so one could lose the other's."""
    dal = KvDal(_SlowEngine())
    name = new_version_name("scores")
    dal.create_namespace(name, "scores")
    writers = [threading.Thread(target=dal.set_labels, args=(name, {f"bulldozer.test{i}": str(i)})) for i in range(8)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(dal.describe(name).labels) == sorted(f"bulldozer.test{i}" for i in range(8))


class _SlowEngine(MemoryEngine):
    """The memory engine with a pause between reading a record and anything after (where
    a store's round trip is)."""

    def get_namespace(self, name: str) -> NamespaceRecord | None:
        record = super().get_namespace(name)
        time.sleep(0.01)
        return record


def test_a_run_not_heard_from_says_it_stopped() -> None:
    """``bulldozer runs`` showed a killed run "running" until gc dropped its version."""
    from bulldozer.versioning.run_state import RUN_KEY_LABEL, RUN_LABEL, RunRecord, run_record_of

    running = RunRecord(run_id="r1", job="scores", alias="scores").to_json()
    alive = _version(State.LOADING, changed_ago=DAY, beat_ago=timedelta(minutes=1))
    killed = _version(State.LOADING, changed_ago=DAY, beat_ago=ALIVE_WITHIN + timedelta(minutes=1))
    scheduled = _version(State.LOADING, changed_ago=DAY, beat_ago=ALIVE_WITHIN + timedelta(minutes=1))
    for version in (alive, killed, scheduled):
        version.labels[RUN_LABEL] = running
    scheduled.labels[RUN_KEY_LABEL] = "scheduled__2026-11-29"
    said = {name: run_record_of(v, NOW) for name, v in (("alive", alive), ("killed", killed), ("sched", scheduled))}
    assert {name: run.outcome for name, run in said.items() if run} == {
        "alive": "running",
        "killed": "stopped",
        "sched": "running",  # between its scheduled tasks, or waiting for a retry: the scheduler's to say
    }
    assert said["killed"] is not None and said["killed"].error == (
        "its run has not been heard from since 2026-11-29 11:57:00 UTC (killed?); "
        f"`bulldozer run SPEC --resume {killed.name}` goes on with it"
    )


def test_a_run_killed_on_this_machine_is_known_to_have_ended_at_once() -> None:
    """Its heartbeat is a second old, but its process is gone: a resume or gc need not wait
    for it to go quiet. A process elsewhere, or still running here, counts as alive."""
    from bulldozer.versioning.run_state import being_made

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    here = Beat.now()
    version = _version(State.LOADING, changed_ago=timedelta(seconds=1))
    now = here.at + timedelta(seconds=1)
    for pid, made in ((dead_pid, False), (os.getppid(), True)):  # the parent: alive
        version.labels[HEARTBEAT_LABEL] = Beat(here.at, here.host, here.pid_namespace, pid).to_json()
        assert being_made(version, now) is made, pid
    version.labels[HEARTBEAT_LABEL] = Beat(here.at, "elsewhere", here.pid_namespace, dead_pid).to_json()
    assert being_made(version, now)  # another machine's pid says nothing here
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(0.5)  # exited, not yet reaped
    version.labels[HEARTBEAT_LABEL] = Beat(here.at, here.host, here.pid_namespace, zombie.pid).to_json()
    assert not being_made(version, now)
    zombie.wait()


def test_a_run_of_this_machine_before_it_restarted_is_known_to_have_ended() -> None:
    """A machine that crashed and came back: the host and the PID namespace's name are the
    same again, and the run's pid may belong to a process of the new boot (here: the test's
    parent, alive), which made a retry refuse to resume the version ("a run is making it
    now") until the beat was minutes old. The beat names the boot it was written in."""
    from bulldozer.versioning.run_state import being_made

    here = Beat.now()
    assert here.boot and Beat.from_json(here.to_json()) == here
    version = _version(State.LOADING, changed_ago=timedelta(seconds=1))
    now = here.at + timedelta(seconds=1)
    for boot, made in ((here.boot, True), ("0b0e7e5e-before-the-crash", False), ("", True)):  # "": an older release's
        version.labels[HEARTBEAT_LABEL] = Beat(
            here.at, here.host, here.pid_namespace, os.getppid(), boot=boot
        ).to_json()
        assert being_made(version, now) is made, boot


def test_a_run_that_ended_is_not_alive_though_its_process_is() -> None:
    """A scheduler's worker runs a load stage in-process; the load fails and leaves its
    version LOADING for the retry, which the same process may run at once."""
    from bulldozer.versioning.run_state import being_made

    dal = KvDal(MemoryEngine())
    name = new_version_name("scores")
    dal.create_namespace(name, "scores")
    heartbeat = Heartbeat(name, lambda labels: dal.set_labels(name, labels), every=3600).start()
    time.sleep(0.05)
    assert being_made(dal.describe(name), utcnow())
    heartbeat.stop()
    version = dal.describe(name)
    beat = beat_of(version)
    assert beat is not None and beat.ended and not being_made(version, utcnow())
    # its end not written (the DAL was away as it stopped): this process knows it beats no more
    version.labels[HEARTBEAT_LABEL] = Beat.now().to_json()
    assert not being_made(version, utcnow())


def test_a_client_tells_time_on_its_dals_clock(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``KvClient.now`` is the DAL's clock (``DescribeStore`` says it), not this machine's,
    and a run's heartbeat is written on it: a beat on it is alive for a reader on another
    machine, whose clock is ten minutes off this one's, where a beat on the writer's own
    clock is taken for a dead run's."""
    from bulldozer.kv import KvClient
    from bulldozer.versioning.run_state import being_made

    dal = KvDal(MemoryEngine())
    ahead = timedelta(minutes=10)
    monkeypatch.setattr("bulldozer.kv.server.servicer.utcnow", lambda: utcnow() + ahead)  # the DAL's machine
    writer, reader = KvClient.in_process(dal), KvClient.in_process(dal)
    with caplog.at_level(logging.WARNING, logger="bulldozer.kv.client"):
        assert abs(writer.now() - (utcnow() + ahead)) < timedelta(seconds=1)
    (said,) = [r.getMessage() for r in caplog.records]  # the operator is told, once
    assert said.startswith("this machine's clock is 600 s behind the clock of the KV DAL at in-process"), said
    name = new_version_name("scores")
    dal.create_namespace(name, "scores")
    Heartbeat(name, lambda labels: dal.set_labels(name, labels), every=3600, clock=writer.now).start().stop()
    beat = beat_of(dal.describe(name))
    assert beat is not None and abs(beat.at - (utcnow() + ahead)) < timedelta(seconds=1)

    def elsewhere(at: datetime) -> NamespaceRecord:  # a beat of a live process on another machine
        return NamespaceRecord(
            name, "scores", labels={HEARTBEAT_LABEL: Beat(at, "elsewhere", "pid:[1]", 4242).to_json()}
        )

    assert being_made(elsewhere(writer.now()), reader.now())
    assert not being_made(elsewhere(utcnow()), reader.now())  # the writer's own clock: ten minutes behind
    # the DAL's clock set right: a client asks again once its measure is CLOCK_OFFSET_SECONDS old
    monkeypatch.setattr("bulldozer.kv.server.servicer.utcnow", utcnow)
    assert abs(writer.now() - (utcnow() + ahead)) < timedelta(seconds=1)
    monkeypatch.setattr("bulldozer.kv.client.CLOCK_OFFSET_SECONDS", 0.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bulldozer.kv.client"):
        assert abs(writer.now() - utcnow()) < timedelta(seconds=1)
    assert caplog.records == []  # the clocks agree: nothing to say


def test_a_dal_that_does_not_say_its_clock_leaves_a_client_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DAL of a release before ``StoreInfo.now``: the client tells time on its own clock."""
    from bulldozer.kv import KvClient, convert
    from bulldozer.kv.server.servicer import NamespacesServicer

    monkeypatch.setattr(
        NamespacesServicer, "DescribeStore", lambda self, request, context: convert.store_info(self.dal.store_info())
    )
    monkeypatch.setattr("bulldozer.kv.server.servicer.utcnow", lambda: utcnow() + timedelta(minutes=10))
    assert abs(KvClient.in_process(KvDal(MemoryEngine())).now() - utcnow()) < timedelta(seconds=1)


def test_a_client_asks_for_the_store_once_for_its_clock_and_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's heartbeat asks the DAL's clock (``DescribeStore``), then its load the store's
    limits: one answer serves both while it is at most ``CLOCK_OFFSET_SECONDS`` old."""
    from bulldozer.kv import KvClient
    from bulldozer.kv.server.servicer import NamespacesServicer

    asked: list[int] = []
    served = NamespacesServicer.DescribeStore

    def counted(self: Any, request: Any, context: Any) -> Any:
        asked.append(1)
        return served(self, request, context)

    monkeypatch.setattr(NamespacesServicer, "DescribeStore", counted)
    client = KvClient.in_process(KvDal(MemoryEngine()))
    client.now()
    info = client.describe_store()
    assert info is not None and info.engine == "memory" and len(asked) == 1
    assert client.describe_store() == info and len(asked) == 1
    monkeypatch.setattr("bulldozer.kv.client.CLOCK_OFFSET_SECONDS", 0.0)  # an answer that old is asked again
    assert client.describe_store() == info and len(asked) == 2
    other = KvClient.in_process(KvDal(MemoryEngine()))
    assert other.describe_store() == info and len(asked) == 3  # a client's answer is its own
