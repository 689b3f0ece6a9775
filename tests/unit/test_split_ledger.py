"""A load's split ledger (bulldozer.versioning.run_state.SplitLedger): written as splits are
acknowledged, at most once per interval, the splits acknowledged meanwhile together, and
whatever is left when the load ends; each write holds every split so far."""

from __future__ import annotations

import json
import time
from typing import Any

from bulldozer.versioning.run_state import LEDGER_LABEL, SplitLedger


def _ledger(every: float, done: dict[str, Any] | None = None) -> tuple[SplitLedger, list[dict[str, Any]]]:
    writes: list[dict[str, Any]] = []
    return SplitLedger(lambda labels: writes.append(json.loads(labels[LEDGER_LABEL])), done or {}, every), writes


def test_splits_acknowledged_within_the_interval_are_written_together() -> None:
    ledger, writes = _ledger(every=3600.0, done={"s0": [5, 0, 0, {}]})  # splits a resumed run holds already
    ledger.add("s1", [1, 11, 10, {}])  # the first is written at once
    ledger.add("s2", [2, 22, 20, {}])
    ledger.add("s3", [3, 33, 30, {}])
    assert [sorted(w) for w in writes] == [["s0", "s1"]]
    ledger.flush()  # the load ended: what is left
    assert [sorted(w) for w in writes] == [["s0", "s1"], ["s0", "s1", "s2", "s3"]]
    assert writes[-1]["s3"] == [3, 33, 30, {}]
    ledger.flush()  # nothing new: no write
    assert len(writes) == 2


def test_a_split_after_the_interval_is_written_at_once() -> None:
    ledger, writes = _ledger(every=0.05)
    ledger.add("a", [1, 1, 1, {}])
    ledger.add("b", [1, 2, 1, {}])
    time.sleep(0.06)
    ledger.add("c", [1, 3, 1, {}])
    assert [sorted(w) for w in writes] == [["a"], ["a", "b", "c"]]


def test_a_load_with_no_split_writes_nothing() -> None:
    ledger, writes = _ledger(every=0.0)
    ledger.flush()
    assert writes == []


def test_a_ledger_that_does_not_parse_is_never_resumed() -> None:
    """Which splits a LOADING version holds whole is what its ledger says; one that does not
    parse (another tool wrote the label) says nothing, so the version is not resumed."""
    import pytest

    from bulldozer.errors import NamespaceStateError
    from bulldozer.kv.types import NamespaceRecord, State
    from bulldozer.versioning.run_state import ledger_of

    def version(text: str) -> NamespaceRecord:
        return NamespaceRecord(name="a__v1", alias="a", state=State.LOADING, labels={LEDGER_LABEL: text})

    assert ledger_of(version('{"s1": [1, 2, 3, {}]}')) == {"s1": [1, 2, 3, {}]}
    for text in ("{not json", "[1, 2]", '{"s1": 5}'):
        with pytest.raises(NamespaceStateError, match=r"^a__v1's record of the splits it holds .* cannot be resumed"):
            ledger_of(version(text))
