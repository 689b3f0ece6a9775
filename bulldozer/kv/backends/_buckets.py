"""Hash buckets for engines that cannot keep one namespace's keys in a sorted tree
(Redis): a namespace's records are spread over a fixed number of buckets by a hash of
the key, so the data spreads across cluster slots and a namespace is dropped a bucket
at a time. Such engines scan in *bucket order*: by (bucket, key), which is stable and
resumable after any key it returned, but not the keys' byte order."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import xxhash

__all__ = ["bucket_of", "group_by_bucket", "scan_in_bucket_order"]


def bucket_of(key: bytes, buckets: int) -> int:
    return xxhash.xxh3_64_intdigest(key) % buckets


def group_by_bucket(records: Iterable[tuple[bytes, bytes]], buckets: int) -> dict[int, dict[bytes, bytes]]:
    grouped: dict[int, dict[bytes, bytes]] = {}
    hash_ = xxhash.xxh3_64_intdigest
    for key, value in records:
        b = hash_(key) % buckets
        group = grouped.get(b)
        if group is None:
            group = grouped[b] = {}
        group[key] = value
    return grouped


def scan_in_bucket_order(
    fetch: Callable[[int], dict[bytes, bytes]], buckets: int, after: bytes | None, limit: int
) -> list[tuple[bytes, bytes]]:
    """Up to ``limit`` pairs in (bucket, key) order after ``after``; ``fetch(b)`` reads one bucket."""
    out: list[tuple[bytes, bytes]] = []
    start = 0 if after is None else bucket_of(after, buckets)
    for b in range(start, buckets):
        items = sorted(fetch(b).items())
        if after is not None and b == start:
            items = [kv for kv in items if kv[0] > after]
        out.extend(items[: limit - len(out)])
        if len(out) >= limit:
            break
    return out
