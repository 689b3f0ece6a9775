"""The storage-engine ABC behind the KV DAL, and the records engines keep.

An engine stores namespaces (metadata + data), aliases and the alias history. It owns
the atomicity the lifecycle needs:

* ``put`` refuses unless the namespace is LOADING, *atomically with the write* (so a seal
  can never race a late write);
* ``transition`` changes a namespace's state only from an expected state;
* ``flip_alias`` is the compare-and-set: in one atomic step it checks the alias still
  points at ``expected``, points it at the new version, marks the new version ACTIVE and
  the old one RETIRED, and appends the change to the history. Several DAL processes can
  therefore front one store.

Lifecycle *rules* (which transitions are legal, size limits, name checks) live in the
server's servicer, which is the only caller; engines enforce only what must be atomic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar

from bulldozer.codec.digest import Digest
from bulldozer.kv.types import AliasChange, AliasRecord, BaseCopy, NamespaceRecord, State

__all__ = ["RecordChanged", "StorageEngine", "chunked"]


class RecordChanged(Exception):
    """``StorageEngine.transition``'s record changed since the ``based_on`` it was given was
    read: the caller reads it again and redoes its change."""


def chunked(pairs: Iterable[tuple[bytes, bytes]], size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """Lists of up to ``size`` pairs (what ``iterate`` yields)."""
    buf: list[tuple[bytes, bytes]] = []
    for pair in pairs:
        buf.append(pair)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def select_namespaces(
    records: Iterable[NamespaceRecord], alias: str | None, states: frozenset[State] | None
) -> list[NamespaceRecord]:
    """``records`` of ``alias`` (None: any) in ``states`` (None: any), oldest first: what
    ``StorageEngine.list_namespaces`` returns."""
    chosen = [r for r in records if (alias is None or r.alias == alias) and (states is None or r.state in states)]
    return sorted(chosen, key=lambda r: (r.created, r.name))


class StorageEngine(ABC):
    """One storage engine. Implementations are thread-safe."""

    #: Registry name.
    name: ClassVar[str]
    #: Largest key the engine can store.
    max_key_bytes: ClassVar[int] = 4096
    #: Largest value the engine can store.
    max_value_bytes: ClassVar[int] = 64 * 1024 * 1024
    #: True when ``scan`` returns keys in byte order; otherwise in another stable order
    #: (hash buckets, tokens) that is still resumable after any key it returned.
    key_ordered_scan: ClassVar[bool] = True
    #: How ``copy_records`` gives a version its base (the default copies record by record;
    #: an engine overriding it with a cheaper copy says so).
    base_copy: ClassVar[BaseCopy] = BaseCopy.RECORDS

    # -- namespaces -------------------------------------------------------------

    @abstractmethod
    def create_namespace(self, record: NamespaceRecord) -> None:
        """Store a new LOADING namespace. Raises NamespaceExistsError if the name is taken
        (also by a dropped namespace: names are never reused)."""

    @abstractmethod
    def get_namespace(self, name: str) -> NamespaceRecord | None:
        """The namespace's record (DROPPED ones included), or None."""

    @abstractmethod
    def list_namespaces(
        self, alias: str | None = None, states: frozenset[State] | None = None
    ) -> list[NamespaceRecord]:
        """Every namespace (of ``alias``; in one of ``states``), oldest first
        (``select_namespaces``)."""

    @abstractmethod
    def transition(
        self, name: str, expected: frozenset[State], record: NamespaceRecord, based_on: NamespaceRecord | None = None
    ) -> NamespaceRecord:
        """Replace the record if the stored state is in ``expected``; else raise
        NamespaceStateError (NamespaceNotFoundError if there is none). With ``based_on``
        (the record a read-modify-write read), only if the stored record is still exactly
        that one; else raise ``RecordChanged`` (another DAL on the store wrote it since).
        Atomic (``_lifecycle.check_transition`` makes both checks)."""

    @abstractmethod
    def drop_data(self, name: str) -> None:
        """Delete the namespace's data (cheaply: a table / sub-database at a time)."""

    # -- data -------------------------------------------------------------------

    @abstractmethod
    def write_batch(self, name: str, keys: list[bytes], values: list[bytes], digest: Digest | None = None) -> None:
        """The one write, the one the DAL calls (in the style of Feast's
        ``OnlineStore.online_write_batch``): ``keys[i]`` gets ``values[i]``, idempotent by
        key (a key given twice keeps the later value), refused (NamespaceStateError) unless
        the namespace is LOADING at the moment of the write.

        ``digest`` is the batch's: an engine that can keep a running digest of the
        namespace in the same atomic write (and knows when a key was written twice, which
        makes a running sum wrong) adds it there, so the seal need not scan everything back
        (see ``stored_digest``); the others ignore it."""

    def copy_records(self, source: str, target: str) -> None:
        """Give the new, empty LOADING namespace ``target`` every record of the readable
        namespace ``source`` (a delta version's base), keeping ``target``'s running digest
        exact where the engine keeps one. The default writes ``source``'s records through
        ``write_batch`` a chunk at a time; an engine with a cheaper copy overrides it."""
        from bulldozer.codec.digest import digest_lists

        for chunk in self.iterate(source):
            keys, values = [k for k, _ in chunk], [v for _, v in chunk]
            self.write_batch(target, keys, values, digest_lists(keys, values))

    @abstractmethod
    def delete_batch(self, name: str, keys: Sequence[bytes]) -> int:
        """Delete ``keys`` from the namespace, refused (NamespaceStateError) unless it is
        LOADING at the moment of the delete; a key that is not there is skipped. Every write
        the namespace acknowledged before is deleted too (an engine that stages writes
        ingests them first). An engine keeping a running digest subtracts the deleted pairs
        from it in the same atomic step. Returns how many keys were there."""

    def ingest(self, name: str) -> tuple[int, int]:
        """Make what ``write_batch`` staged for the namespace part of its data, atomically,
        returning (runs, records) merged. An engine that stages writes (embedded: a sorted
        run per batch, merged in key order with LMDB's append mode) does it here; one that
        writes in place has nothing to do. The DAL calls it before a seal measures, so a
        version is never measured (or read) with writes still staged."""
        return 0, 0

    def stored_digest(self, name: str) -> Digest | None:
        """The exact digest of what the namespace stores, when the engine kept one (see
        ``write_batch``); None means unknown, and the DAL measures it (``measure``)."""
        return None

    def measure(self, name: str) -> Digest:
        """The digest of what a frozen namespace stores, measured by reading every pair back
        (what a seal records when there is no exact ``stored_digest``); an engine with a
        faster way may override it."""
        digest = Digest()
        for chunk in self.iterate(name):
            digest.add_pairs(chunk)
        return digest

    @abstractmethod
    def get_many(self, name: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values for ``keys`` (None when absent), all from one consistent view."""

    @abstractmethod
    def scan(self, name: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs in the engine's scan order (key order when
        ``key_ordered_scan``), starting after ``after``, a key the scan returned."""

    def iterate(self, name: str, chunk: int = 50_000) -> Iterator[list[tuple[bytes, bytes]]]:
        """Every pair, in chunks (used for the seal digest)."""
        after: bytes | None = None
        while True:
            page = self.scan(name, after, chunk)
            if not page:
                return
            yield page
            after = page[-1][0]

    def sample(self, name: str, count: int, seed: int) -> tuple[list[tuple[bytes, bytes]], int]:
        """The ``count`` pairs whose keys have the smallest XXH64(key, seed), smallest first,
        and how many pairs the namespace holds. The choice depends on the keys alone, so two
        namespaces sampled with one seed hold the same keys where they store the same keys
        (a coordinated "bottom-k" sample: what a shadow read compares). Reads everything once,
        keeping ``count`` candidates; an engine with a cheaper way may override it."""
        import numpy as np

        from bulldozer.codec.digest import seeded_hashes

        best: list[tuple[bytes, bytes]] = []
        best_hashes = np.empty(0, dtype=np.uint64)
        scanned = 0
        for chunk in self.iterate(name):
            scanned += len(chunk)
            hashes = np.concatenate([best_hashes, seeded_hashes([k for k, _ in chunk], seed)])
            pool = best + chunk
            if len(pool) > count:
                keep = np.argpartition(hashes, count - 1)[:count]
                best, best_hashes = [pool[i] for i in keep], hashes[keep]
            else:
                best, best_hashes = pool, hashes
        order = sorted(range(len(best)), key=lambda i: (int(best_hashes[i]), best[i][0]))
        return [best[i] for i in order], scanned

    # -- aliases ----------------------------------------------------------------

    @abstractmethod
    def get_alias(self, alias: str) -> AliasRecord | None: ...

    @abstractmethod
    def list_aliases(self) -> list[AliasRecord]: ...

    @abstractmethod
    def flip_alias(
        self, alias: str, expected: str | None, target: str, principal: str, reason: str, respect_pin: bool = False
    ) -> AliasRecord:
        """The compare-and-set, atomically with the state changes and the history entry.

        Raises AliasConflictError if the alias does not point at ``expected`` (None: not
        set), NamespaceStateError if ``target`` is not SEALED or RETIRED,
        NamespaceNotFoundError if it does not exist, and AliasPinnedError if the alias is
        pinned and ``respect_pin``. The pin survives a flip.
        """

    @abstractmethod
    def set_pin(self, alias: str, pinned: bool, principal: str, reason: str) -> AliasRecord:
        """Pin or unpin the alias where it points, with a history entry (atomic).
        AliasNotFoundError if the alias points nowhere yet."""

    @abstractmethod
    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        """Changes to ``alias``, newest first."""

    def auth_required(self) -> bool:
        """True when this store was once served with authentication (see ``require_auth``)."""
        return False

    def require_auth(self) -> None:  # noqa: B027 - optional hook
        """Record in the store that it is served with authentication, so a later server
        without it refuses to start unless told to on purpose. Engines whose store a
        Bulldozer server owns alone (embedded) implement it."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make everything written so far durable."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Only once no request thread uses the engine any more."""
