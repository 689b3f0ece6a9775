"""Failures on demand, for the tests of failure handling (none of this is in the package).

* ``FaultyEngine`` wraps a load engine: after N rows it raises, or SIGKILLs, SIGTERMs or
  SIGHUPs its process.
* ``FlakyTransport`` wraps a KV client's transport: the DAL becomes unreachable after N
  batches (``KvClient.over(FlakyTransport(...), ...)``); ``StalledTransport``, and its calls
  hang a while first.
* ``python -m tests.faults FAULT ARGS...`` runs ``bulldozer ARGS...`` with ``FAULT``
  injected into every run the command makes:

  - ``raise-after-rows:N`` / ``kill-after-rows:N`` / ``term-after-rows:N`` /
    ``hup-after-rows:N``: during the load, through ``FaultyEngine``;
  - ``kill-at:STAGE``: SIGKILL as the stage starts (e.g. ``verify``, ``flip``), through the
    runner's public ``on_stage`` hook.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bulldozer.errors import BackendUnavailableError
from bulldozer.kv import KvClient
from bulldozer.kv._transports import Transport
from bulldozer.load.engines.base import LoadEngine, LoadPlan, LoadResult, SplitDone
from bulldozer.load.runner import STAGES

__all__ = ["FaultyEngine", "FlakyTransport", "main", "parse"]


def parse(text: str) -> tuple[str, int | str]:
    """``(kind, rows or stage)`` of a fault's text."""
    if text.startswith("kill-at:"):
        stage = text.removeprefix("kill-at:")
        if stage not in STAGES:
            raise ValueError(f"kill-at: takes one of {', '.join(STAGES)}, not {stage!r}")
        return "kill-at", stage
    kind, _, rows = text.partition("-after-rows:")
    if kind not in ("raise", "kill", "term", "hup") or not rows.isdigit():
        raise ValueError(
            f"{text!r}: expected raise-after-rows:N, kill-after-rows:N, term-after-rows:N, hup-after-rows:N "
            "or kill-at:STAGE"
        )
    return kind, int(rows)


class FaultyEngine(LoadEngine):
    """``engine``, except that once ``rows`` rows are loaded it raises (``raise``) or its
    process is SIGKILLed (``kill``), or SIGTERMed (``term``) or SIGHUPed (``hup``) once."""

    def __init__(self, engine: LoadEngine, kind: str, rows: int) -> None:
        self.engine, self.kind, self.rows = engine, kind, rows
        self.termed = False
        self.name = engine.name  # type: ignore[misc]  # a class variable, mirrored per instance
        self.resumes_splits = engine.resumes_splits  # type: ignore[misc]
        self.runs_sql = engine.runs_sql  # type: ignore[misc]

    def load(
        self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Callable[[int, int], None]
    ) -> LoadResult:
        def failing(rows: int, total: int) -> None:
            progress(rows, total)
            if rows >= self.rows:
                if self.kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.kind in ("term", "hup"):
                    if not self.termed:
                        self.termed = True
                        os.kill(os.getpid(), signal.SIGTERM if self.kind == "term" else signal.SIGHUP)
                    return
                raise RuntimeError(f"injected failure after {rows} rows")

        return self.engine.load(plan, client, on_split, failing)

    def key_hashes_of(self, plan: LoadPlan, split_ids: set[str] | None) -> list[np.ndarray[Any, Any]]:
        return self.engine.key_hashes_of(plan, split_ids)

    def find_keys(self, plan: LoadPlan, hashes: set[int], limit: int = 3) -> list[dict[str, Any]]:
        return self.engine.find_keys(plan, hashes, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class FlakyTransport(Transport):
    """``inner``, except that every batch after the first ``batches`` fails as a DAL gone
    away would (BackendUnavailableError), and so does every call after that (``refused``:
    each unary call's method and timeout)."""

    def __init__(self, inner: Transport, batches: int) -> None:
        self.inner, self.left = inner, batches
        self.data, self.namespaces, self.aliases = inner.data, inner.namespaces, inner.aliases
        self.broken = False
        self.refused: list[tuple[str, float]] = []

    def _check(self) -> None:
        if self.broken:
            raise BackendUnavailableError("the KV DAL is not reachable (injected)")

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        if self.broken:
            self.refused.append((method, timeout))
        self._check()
        return self.inner.call(stub, method, request, timeout)

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        self._check()
        return self.inner.future(stub, method, request, timeout)

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        if self.left <= 0:
            self.broken = True
        self._check()
        self.left -= 1
        return self.inner.put_batch_future(payload, timeout)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        self._check()
        return self.inner.stream(stub, method, request, timeout)

    def client_stream(self, stub: Any, method: str, requests: Iterator[Any], timeout: float) -> Any:
        self._check()
        return self.inner.client_stream(stub, method, requests, timeout)


class StalledTransport(FlakyTransport):
    """``FlakyTransport``, except that a unary call after the break hangs for ``stall``
    seconds (or its timeout, if shorter) before it fails, as against a store that stopped
    answering; ``stalled`` holds each such call's method, the labels it set, and when it
    started and ended (``time.monotonic``)."""

    def __init__(self, inner: Transport, batches: int, stall: float) -> None:
        super().__init__(inner, batches)
        self.stall = stall
        self.stalled: list[tuple[str, frozenset[str], float, float]] = []

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        if not self.broken:
            return super().call(stub, method, request, timeout)
        started = time.monotonic()
        time.sleep(min(self.stall, timeout))
        labels = frozenset(getattr(request, "labels", {}))
        self.stalled.append((method, labels, started, time.monotonic()))
        return super().call(stub, method, request, timeout)


class LostAnswerTransport(FlakyTransport):
    """``inner``, except that each ``method`` call reaches the DAL twice, as a call whose answer
    was lost on the way back and that the gRPC channel retried (it retries UNAVAILABLE):
    the caller gets the second answer."""

    def __init__(self, inner: Transport, method: str) -> None:
        super().__init__(inner, batches=1 << 60)
        self.method, self.lost = method, 0

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        if method == self.method:
            self.inner.call(stub, method, request, timeout)
            self.lost += 1
        return self.inner.call(stub, method, request, timeout)


def inject(fault: str) -> None:
    """Make every ``JobRun`` of this process fail as ``fault`` says."""
    from bulldozer.load import runner

    kind, where = parse(fault)
    real_init = runner.JobRun.__init__

    def init(self: runner.JobRun, *args: Any, **kwargs: Any) -> None:
        if kind == "kill-at":
            on_stage = kwargs.get("on_stage") or (lambda stage: None)

            def dying(stage: str) -> None:
                if stage == where:
                    os.kill(os.getpid(), signal.SIGKILL)
                on_stage(stage)

            kwargs["on_stage"] = dying
        real_init(self, *args, **kwargs)
        if kind != "kill-at":
            self.load_engine = FaultyEngine(self.load_engine, kind, int(where))

    runner.JobRun.__init__ = init  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    inject(argv[0])
    from bulldozer.cli.main import main as cli

    sys.argv = ["bulldozer", *argv[1:]]
    cli()  # exits with the command's code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
