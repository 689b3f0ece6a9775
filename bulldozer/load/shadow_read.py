"""The shadow read: before the flip, compare a sample of the new version with the live one.

Both versions are sampled by the DAL with one seed (``KvClient.sample``: the records whose
keys have the smallest XXH64(key, seed)). That choice depends on the keys alone, so the
``sample`` smallest keys of the two samples together are a uniform sample of the keys of
*either* version, and each version's sample holds every one of them that it stores. Each
sampled key is then exactly one of:

* **missing** — the live version holds it, the new one does not;
* **added** — the new version holds it, the live one does not;
* **changed** / **same** — both hold it, with another / the same value.

Fractions: missing and added are of all sampled keys; changed is of the sampled keys both
versions hold. Values are compared as stored bytes when both versions have one schema (the
encoding is deterministic), else decoded (``schema.decode.ReadableJson``), so a compatible
schema change alone does not count as a change. A few examples of each kind are kept with
their keys and, for changed values, the fields that differ, decoded to readable JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bulldozer.kv.client import KvClient
from bulldozer.kv.types import NamespaceRecord
from bulldozer.spec.models import ShadowRead

__all__ = ["ShadowReadReport", "shadow_read"]

#: at most this many differing fields are kept per changed example
_FIELDS_PER_EXAMPLE = 10


@dataclass
class ShadowReadReport:
    """What the shadow read found; kept in the run record (``RunRecord.shadow_read``)."""

    live: str
    seed: int
    #: keys compared: the union sample (at most the configured sample size)
    sampled: int = 0
    missing: int = 0
    added: int = 0
    changed: int = 0
    same: int = 0
    #: records each version holds (the DAL read both in full to sample them)
    live_records: int = 0
    new_records: int = 0
    #: how long the shadow read took (a part of the verify stage)
    seconds: float = 0.0
    #: up to ``examples`` of each kind: {"kind", "key", and for "changed" the "fields" that differ}
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def missing_fraction(self) -> float:
        return self.missing / self.sampled if self.sampled else 0.0

    @property
    def added_fraction(self) -> float:
        return self.added / self.sampled if self.sampled else 0.0

    @property
    def changed_fraction(self) -> float:
        both = self.changed + self.same
        return self.changed / both if both else 0.0

    def summary(self) -> str:
        """One line, e.g. ``1,000 keys vs v…: 0.3% missing, 1.0% added, 2.1% changed``."""
        return (
            f"{self.sampled:,} sampled keys vs {self.live}: {self.missing_fraction:.1%} missing, "
            f"{self.added_fraction:.1%} added, {self.changed_fraction:.1%} of the rest changed"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShadowReadReport:
        """Back from ``as_dict`` (the derived fractions are dropped: they are properties)."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            missing_fraction=round(self.missing_fraction, 6),
            added_fraction=round(self.added_fraction, 6),
            changed_fraction=round(self.changed_fraction, 6),
        )
        return out


class _Decoder:
    """A version's keys and values as readable JSON, from its stored descriptor."""

    def __init__(self, record: NamespaceRecord) -> None:
        from bulldozer.schema.compile import load_message_classes
        from bulldozer.schema.decode import ReadableJson

        self.descriptor = record.value_descriptor_set
        self.readable = ReadableJson(record.value_descriptor_set)
        self.key_cls, self.value_cls = load_message_classes(
            record.value_descriptor_set, record.key_message, record.value_message
        )

    def key(self, data: bytes) -> dict[str, Any]:
        return self._readable(self.key_cls, data)

    def value(self, data: bytes) -> dict[str, Any]:
        return self._readable(self.value_cls, data)

    def _readable(self, cls: Any, data: bytes) -> dict[str, Any]:
        """A record that does not parse (the live version may hold one a release that did not
        check its text stored) is shown as why, not a failed run: the new version replaces it."""
        from bulldozer.errors import UnreadableRecordError

        try:
            return self.readable.decode(cls, data)
        except UnreadableRecordError as exc:
            return {"unreadable": str(exc)}


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for name, item in data.items():
            out.update(_flatten(item, f"{prefix}.{name}" if prefix else str(name)))
        return out
    return {prefix: data}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    before, after = _flatten(old), _flatten(new)
    paths = sorted(set(before) | set(after))
    return [{"field": p, "live": before.get(p), "new": after.get(p)} for p in paths if before.get(p) != after.get(p)][
        :_FIELDS_PER_EXAMPLE
    ]


def shadow_read(
    client: KvClient, new: NamespaceRecord, live: NamespaceRecord, settings: ShadowRead
) -> ShadowReadReport:
    """Compare ``settings.sample`` keys of the readable version ``new`` with ``live``."""
    import time

    from bulldozer.codec.digest import xxh64

    started = time.perf_counter()
    seed, size = settings.seed, settings.sample
    _, new_sample, new_records = client.sample(size, seed, namespace=new.name)
    _, live_sample, live_records = client.sample(size, seed, namespace=live.name)
    new_values, live_values = dict(new_sample), dict(live_sample)
    keys = sorted(set(new_values) | set(live_values), key=lambda k: (xxh64(k, seed), k))[:size]

    report = ShadowReadReport(
        live=live.name, seed=seed, sampled=len(keys), live_records=live_records, new_records=new_records
    )
    same_schema = new.value_descriptor_set == live.value_descriptor_set and (
        new.key_message,
        new.value_message,
    ) == (live.key_message, live.value_message)
    new_decoder = _Decoder(new)
    live_decoder = new_decoder if same_schema else _Decoder(live)
    shown = {"missing": 0, "added": 0, "changed": 0}

    def example(kind: str, key: bytes, decoder: _Decoder, **more: Any) -> None:
        if shown[kind] < settings.examples:
            shown[kind] += 1
            report.examples.append({"kind": kind, "key": decoder.key(key), **more})

    for key in keys:
        old, now = live_values.get(key), new_values.get(key)
        if now is None:
            report.missing += 1
            example("missing", key, live_decoder)
        elif old is None:
            report.added += 1
            example("added", key, new_decoder)
        elif old == now:
            report.same += 1
        elif same_schema:  # one deterministic encoding: other bytes are another value
            report.changed += 1
            if shown["changed"] < settings.examples:
                diffs = _differences(live_decoder.value(old), new_decoder.value(now))
                example("changed", key, new_decoder, fields=diffs)
        else:  # a field the old schema lacks reads as null there
            diffs = _differences(live_decoder.value(old), new_decoder.value(now))
            if not diffs:
                report.same += 1
                continue
            report.changed += 1
            example("changed", key, new_decoder, fields=diffs)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
