"""Compatibility between a previous generated schema and a new one.

Both sides are serialized ``FileDescriptorSet``s (a stored version's descriptor, or a
compiled ``.proto``). The generated file's first message is the key, the second the
value. Fields are matched by number, recursively through nested messages.

Value message — allowed: add a field, drop a field (its number and name become
``reserved``), rename a field, widen int32 → int64, add or remove ``optional``.
Refused: any other type change, singular ↔ repeated, a number reused for another field.

Key message — the bytes of a key must stay identical, or lookups silently miss: only a
rename is allowed; adding, dropping or changing any key field is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from google.protobuf import descriptor_pb2

from bulldozer.codec.descriptors import descriptor_files
from bulldozer.errors import SchemaError
from bulldozer.schema.model import ProtoFile, ProtoMessage

__all__ = ["CompatReport", "Difference", "apply_reserved", "check_compatibility", "check_previous"]

Verdict = Literal["allowed", "refused"]
_FDP = descriptor_pb2.FieldDescriptorProto
_WIDENING = {(_FDP.TYPE_INT32, _FDP.TYPE_INT64)}


@dataclass(frozen=True)
class Difference:
    path: str
    change: str
    verdict: Verdict
    detail: str


@dataclass
class CompatReport:
    differences: list[Difference] = field(default_factory=list)

    @property
    def breaking(self) -> bool:
        return any(d.verdict == "refused" for d in self.differences)

    def refused(self) -> list[Difference]:
        return [d for d in self.differences if d.verdict == "refused"]

    def as_dict(self) -> dict[str, object]:
        return {"breaking": self.breaking, "differences": [asdict(d) for d in self.differences]}


class _Index:
    """Messages of a descriptor set by full name, and the generated file's two messages."""

    def __init__(self, fds_bytes: bytes) -> None:
        try:
            files = descriptor_files(fds_bytes)
        except ValueError as exc:  # a live version another tool made, a --against file that is not one
            raise SchemaError(f"the previous schema cannot be read: {exc}") from None
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        for fd in files:
            prefix = f".{fd.package}" if fd.package else ""
            for m in fd.message_type:
                self._add(prefix, m)
        if not files or len(files[-1].message_type) < 2:
            raise SchemaError(
                "the previous schema is not a Bulldozer schema: its last file holds no key and value messages"
            )
        main = files[-1]
        prefix = f".{main.package}" if main.package else ""
        self.key_name = f"{prefix}.{main.message_type[0].name}"
        self.value_name = f"{prefix}.{main.message_type[1].name}"

    def _add(self, prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{m.name}"
        self.messages[name] = m
        for nested in m.nested_type:
            self._add(name, nested)


def _type_label(f: descriptor_pb2.FieldDescriptorProto) -> str:
    names = {v: k for k, v in _FDP.Type.items()}
    t = names[f.type].removeprefix("TYPE_").lower()
    if f.type in (_FDP.TYPE_MESSAGE, _FDP.TYPE_ENUM):
        t = f.type_name.rsplit(".", 1)[-1]
    return ("repeated " if f.label == _FDP.LABEL_REPEATED else "") + t


class _Comparer:
    def __init__(self, old: _Index, new: _Index) -> None:
        self.old, self.new = old, new
        self.report = CompatReport()

    def add(self, path: str, change: str, verdict: Verdict, detail: str) -> None:
        self.report.differences.append(Difference(path, change, verdict, detail))

    def message(self, old_name: str, new_name: str, path: str, key: bool, seen: set[tuple[str, str]]) -> None:
        if (old_name, new_name) in seen:
            return
        seen.add((old_name, new_name))
        old_m, new_m = self.old.messages.get(old_name), self.new.messages.get(new_name)
        if old_m is None or new_m is None:
            return  # well-known types outside the set compare by name only
        old_f = {f.number: f for f in old_m.field}
        new_f = {f.number: f for f in new_m.field}
        old_reserved = {n for r in old_m.reserved_range for n in range(r.start, r.end)}
        for number in sorted(old_f.keys() | new_f.keys()):
            o, n = old_f.get(number), new_f.get(number)
            where = f"{path}.{(n or o).name}" if (n or o) else path  # type: ignore[union-attr]
            if o is None and n is not None:
                if number in old_reserved:
                    self.add(
                        where,
                        "reused reserved number",
                        "refused",
                        f"field number {number} was reserved (a dropped field); old readers would misread it",
                    )
                elif key:
                    self.add(where, "key field added", "refused", "the bytes of every key would change")
                else:
                    self.add(where, "field added", "allowed", f"{_type_label(n)} = {number}")
            elif n is None and o is not None:
                if key:
                    self.add(where, "key field dropped", "refused", "the bytes of every key would change")
                else:
                    self.add(where, "field dropped", "allowed", f"number {number} becomes reserved")
            elif o is not None and n is not None:
                self.field(o, n, where, key, seen)

    def field(
        self,
        o: descriptor_pb2.FieldDescriptorProto,
        n: descriptor_pb2.FieldDescriptorProto,
        where: str,
        key: bool,
        seen: set[tuple[str, str]],
    ) -> None:
        if o.name != n.name:
            self.add(where, "field renamed", "allowed", f"{o.name} → {n.name} (wire format unchanged)")
        if (o.label == _FDP.LABEL_REPEATED) != (n.label == _FDP.LABEL_REPEATED):
            self.add(where, "repeated changed", "refused", f"{_type_label(o)} → {_type_label(n)}")
            return
        if o.type != n.type:
            if (o.type, n.type) in _WIDENING and not key:
                self.add(where, "type widened", "allowed", f"{_type_label(o)} → {_type_label(n)}")
            else:
                reason = "the bytes of every key would change" if key else "old readers would misread the value"
                self.add(
                    where,
                    "type changed",
                    "refused",
                    f"{_type_label(o)} → {_type_label(n)}; {reason}",
                )
            return
        if o.proto3_optional != n.proto3_optional:
            if key:
                self.add(
                    where,
                    "presence changed",
                    "refused",
                    "the bytes of keys holding zero values would change",
                )
            else:
                self.add(
                    where,
                    "presence changed",
                    "allowed",
                    "optional added" if n.proto3_optional else "optional removed",
                )
        if o.type == _FDP.TYPE_MESSAGE:
            if o.type_name.startswith(".google.") or n.type_name.startswith(".google."):
                if o.type_name != n.type_name:
                    self.add(where, "type changed", "refused", f"{o.type_name} → {n.type_name}")
                return
            self.message(o.type_name, n.type_name, where, key, seen)


def check_previous(descriptor_set: bytes) -> None:
    """The SchemaError a comparison with ``descriptor_set`` as the previous schema would
    raise (it does not parse, or is no Bulldozer schema), raised now."""
    _Index(descriptor_set)


def check_compatibility(old_descriptor_set: bytes, new_descriptor_set: bytes) -> CompatReport:
    """Every difference between two generated schemas, each with its verdict."""
    old, new = _Index(old_descriptor_set), _Index(new_descriptor_set)
    cmp = _Comparer(old, new)
    for role, o, n in (
        ("key", old.key_name, new.key_name),
        ("value", old.value_name, new.value_name),
    ):
        o_short, n_short = o.rsplit(".", 1)[-1], n.rsplit(".", 1)[-1]
        if o_short != n_short:
            cmp.add(
                role,
                "message renamed",
                "allowed",
                f"{o_short} → {n_short} (regenerate client code)",
            )
        cmp.message(o, n, n_short, role == "key", set())
    return cmp.report


def apply_reserved(proto: ProtoFile, previous_descriptor_set: bytes) -> None:
    """Reserve, in ``proto``'s value messages, the numbers and names of fields the previous
    schema had and this one dropped, so they can never be reused by mistake."""
    old = _Index(previous_descriptor_set)

    def walk(msg: ProtoMessage, old_name: str) -> None:
        old_m = old.messages.get(old_name)
        if old_m is None:
            return
        numbers = {f.number for f in msg.fields}
        names = {f.name for f in msg.fields}
        previous = {f.number for f in old_m.field} | {n for r in old_m.reserved_range for n in range(r.start, r.end)}
        previous_names = {f.name for f in old_m.field} | set(old_m.reserved_name)
        msg.reserved = sorted(previous - numbers)
        msg.reserved_names = sorted(previous_names - names)
        for nested in msg.nested:
            walk(nested, f"{old_name}.{nested.name}")

    walk(proto.value, old.value_name)
