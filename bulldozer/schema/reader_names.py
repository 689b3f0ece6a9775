"""The names a generated schema may not use because a reader could not: what protobuf's code
generators make of a field's or a message's name in each language a client is generated in
(``bulldozer client``: Python, Java, Go), and where those collide with each other or with
what every generated message already has.

protoc accepts all of these, and so did Bulldozer until it checked: the data loads and is
served, but a column ``descriptor`` gave a Java client that does not compile (its
``getDescriptor()`` is every message's), ``x`` and ``X`` one with ``X_FIELD_NUMBER`` twice,
a column ``DESCRIPTOR`` a Python message whose ``DESCRIPTOR`` is a string (``bulldozer get``
failed on it), ``proto_reflect`` a Go struct whose field and method share a name. Each rule
below was found, and is kept, by compiling: ``tests/integration/test_reader_names.py`` builds
every refused case with the generator it is refused for (it must fail) and a schema of
near-misses with all three (it must build).

The rules take a neutral description of one message (``NamedMessage``), made from the
generated model as the schema is generated (``bulldozer.schema.iceberg``): every command that
generates a schema (``validate --catalog``, ``proto``, ``client``, ``plan``, ``run``) refuses
these names with the column behind them, as it refuses protobuf's reserved words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from google.protobuf import message

from bulldozer.spec.models import JAVA_NESTED_CLASSES

__all__ = [
    "PYTHON_MESSAGE_ATTRIBUTES",
    "Clash",
    "FieldKind",
    "NamedField",
    "NamedMessage",
    "clashes",
    "go_camel",
    "java_camel",
    "map_entry_name",
]

#: How a field is represented, as far as the generated accessors differ
FieldKind = Literal["scalar", "string", "message", "repeated", "repeated_message", "map"]

#: Every Python message's own attributes (its methods and ``DESCRIPTOR``): a field of that
#: name hides them on its messages (``msg.SerializeToString`` is then the field's value)
PYTHON_MESSAGE_ATTRIBUTES = frozenset(name for name in dir(message.Message) if not name.startswith("_"))

#: Java accessors every generated message (or its builder) already has: a field whose
#: accessor is one of them does not compile (the others of that kind protoc renames itself)
_JAVA_MESSAGE_GETTERS = frozenset({"Descriptor", "DefaultInstance", "ParentForChildren", "UnknownFieldSetBuilder"})
#: the fields a Java message keeps its presence bits in
_JAVA_BIT_FIELD = re.compile(r"bitField[0-9]+")
#: accessors a field adds beyond ``get<Name>()``, by its kind (a repeated field's ``List``
#: and ``Count`` accessors protoc renames itself when another field takes them)
_JAVA_DERIVED: dict[str, tuple[str, ...]] = {
    "string": ("{}Bytes",),
    "message": ("{}Builder", "{}OrBuilder"),
    "repeated_message": ("{}Builder", "{}OrBuilder", "{}BuilderList", "{}OrBuilderList"),
    "map": ("{}Map", "Mutable{}"),
}


@dataclass(frozen=True)
class NamedField:
    """One field of a message: its proto name, its kind, and the column it holds (the name
    a refusal gives, and the one a user renames)."""

    name: str
    kind: FieldKind
    column: str


@dataclass(frozen=True)
class NamedMessage:
    """One message: its name, the messages it is nested in (outermost first), its fields,
    and its nested messages as (name, the column each was made for)."""

    name: str
    enclosing: tuple[str, ...]
    fields: tuple[NamedField, ...]
    nested: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        return ".".join((*self.enclosing, self.name))


@dataclass(frozen=True)
class Clash:
    """A name a reader could not use; ``text`` says why and in which language, naming the
    column(s) (``columns``) behind it."""

    text: str
    columns: tuple[str, ...]


def java_camel(name: str, capitalize: bool = True) -> str:
    """protoc's Java name for a field (``UnderscoresToCamelCase``): what follows ``_`` or a
    digit is capitalized, ``_`` dropped, a first capital lowered unless ``capitalize``."""
    out: list[str] = []
    upper_next = capitalize
    for i, ch in enumerate(name):
        if "a" <= ch <= "z":
            out.append(ch.upper() if upper_next else ch)
            upper_next = False
        elif "A" <= ch <= "Z":
            out.append(ch.lower() if i == 0 and not upper_next else ch)
            upper_next = False
        elif "0" <= ch <= "9":
            out.append(ch)
            upper_next = True
        else:
            upper_next = True
    return "".join(out)


def go_camel(name: str) -> str:
    """protoc-gen-go's Go name for a field (``strs.GoCamelCase``)."""
    out: list[str] = []
    i = 0
    while i < len(name):
        ch = name[i]
        if ch == "_" and i == 0:
            out.append("X")
        elif ch == "_" and i + 1 < len(name) and name[i + 1].islower():
            pass
        elif ch.isdigit():
            out.append(ch)
        else:
            out.append(ch.upper() if "a" <= ch <= "z" else ch)
            while i + 1 < len(name) and "a" <= name[i + 1] <= "z":
                i += 1
                out.append(name[i])
        i += 1
    return "".join(out)


def map_entry_name(name: str) -> str:
    """The message protoc makes for the entries of the map field ``name`` (``MapEntryName``)."""
    parts = name.split("_")
    return "".join(p[:1].upper() + p[1:] for p in parts) + "Entry"


def _named(columns: tuple[str, ...]) -> str:
    quoted = [repr(c) for c in columns]
    return ("columns " + " and ".join(quoted)) if len(quoted) > 1 else f"column {quoted[0]}"


def clashes(msg: NamedMessage) -> list[Clash]:
    """What keeps a reader in each language from using ``msg``'s names, in field order."""
    found: list[Clash] = []

    def clash(columns: tuple[str, ...], text: str) -> None:
        found.append(Clash(f"{_named(columns)} {text}", columns))

    fields = msg.fields
    by_constant: dict[str, NamedField] = {}  # a Java constant's name: the first field it names
    camels = {f.name: java_camel(f.name) for f in fields}  # Java's name of each (get<camel>())
    by_accessor: dict[str, NamedField] = {}  # a Java accessor's name: the first field
    for f in fields:
        by_accessor.setdefault(camels[f.name], f)
    for f in fields:
        if f.name in PYTHON_MESSAGE_ATTRIBUTES:
            clash(
                (f.column,),
                f"becomes the field {f.name}, which would hide {f.name}, an attribute every Python message has",
            )
        camel = camels[f.name]
        if not camel:
            clash((f.column,), f"becomes the field {f.name}, with no letter or digit to name it by in Java")
        elif camel in _JAVA_MESSAGE_GETTERS:
            clash((f.column,), f"becomes the Java accessor get{camel}(), which every Java message already has")
        variable = java_camel(f.name, capitalize=False)
        if _JAVA_BIT_FIELD.fullmatch(variable):
            clash((f.column,), f"becomes the Java field {variable}_, where Java messages keep which fields are set")
        if go_camel(f.name) == "ProtoReflect":
            clash((f.column,), "becomes the Go field ProtoReflect, a method every Go message has")
        # (two fields whose accessors collide protoc tells apart itself, getA1B2() and
        # getA1B3(), but not their constants)
        first = by_constant.setdefault(f.name.upper(), f)
        if first is not f:
            clash((first.column, f.column), f"become the same Java constant {f.name.upper()}_FIELD_NUMBER")
        for derived in _JAVA_DERIVED.get(f.kind, ()):
            other = by_accessor.get(derived.format(camel))
            if camel and other is not None and other is not f:
                clash(
                    (other.column, f.column),
                    f"become the same Java accessor get{camels[other.name]}() (a {f.kind.replace('_', ' ')} "
                    f"field {f.name} has one of that name)",
                )
    nested = dict(msg.nested)
    for name, column in msg.nested:
        if name in JAVA_NESTED_CLASSES:
            clash(
                (column,),
                f"becomes the nested message {name}, the name of every Java message's {JAVA_NESTED_CLASSES[name]}",
            )
        if name in msg.enclosing or name == msg.name:
            clash(
                (column,),
                f"becomes the message {msg.path}.{name}, inside a message of the same name, which Java does not allow",
            )
        base = name.removesuffix("OrBuilder")
        if base != name and base in nested:
            clash(
                (nested[base], column),
                f"become the nested messages {base} and {name}, the name of Java's interface for {base}",
            )
    return found
