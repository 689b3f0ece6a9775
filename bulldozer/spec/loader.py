"""Load a job spec from YAML, keeping the line and column of every field.

The YAML is composed into nodes (PyYAML's safe resolver), checked for duplicate keys,
anchor bombs and nesting depth while it is turned into plain Python data, then validated
by the pydantic models. Every problem becomes a :class:`~bulldozer.errors.SpecIssue` that
names the file, line, column and dotted field path; all of them are reported at once.
"""

from __future__ import annotations

import os
import re
import stat
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from bulldozer.errors import SpecError, SpecIssue
from bulldozer.names import did_you_mean
from bulldozer.redaction import yaml_problem
from bulldozer.settings import spec_environment
from bulldozer.spec.models import JobSpec

__all__ = [
    "EXPANDABLE_FIELDS",
    "MAX_SPEC_BYTES",
    "LoadedSpec",
    "Positions",
    "format_path",
    "load_spec",
    "load_spec_text",
]

MAX_SPEC_BYTES = 1024 * 1024
MAX_NODES = 10_000
MAX_DEPTH = 50

PathT = tuple[str | int, ...]
_ENV_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: The fields where ``${VAR}`` is replaced by an environment variable: where an operator's
#: deployment differs (the DAL endpoint, its token, the catalog's connection properties).
#: Anywhere else — a query, a filter, a column, an alias — a ``${`` is refused, so a spec
#: cannot copy the scheduler's environment into the data it loads.
EXPANDABLE_FIELDS = ("key_value_dal.endpoint", "key_value_dal.token", "data_movement.catalog.properties.*")


def expandable(path: PathT) -> bool:
    """True where ``${VAR}`` expands (see EXPANDABLE_FIELDS)."""
    return path in (("key_value_dal", "endpoint"), ("key_value_dal", "token")) or (
        len(path) == 4 and path[:3] == ("data_movement", "catalog", "properties")
    )


def format_path(path: PathT) -> str:
    """``('key_value_dal', 'alias')`` → ``key_value_dal.alias``; ints become ``[i]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


@dataclass
class Positions:
    """Where each field of a document stands: ``path -> (line, column)``, both 1-based."""

    marks: dict[PathT, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: PathT) -> tuple[int, int] | None:
        """The position of ``path``, or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            found = self.marks.get(tuple(path[:n]))
            if found is not None:
                return found
        return None


@dataclass(frozen=True)
class LoadedSpec:
    """A valid spec with the file it came from and its field positions."""

    spec: JobSpec
    source: str
    text: str
    positions: Positions
    #: dotted paths of the fields whose value came from ``${VAR}`` expansion: the
    #: environment's, not the spec's own (a token there is the operator's credential)
    expanded: frozenset[str] = frozenset()

    @property
    def sha256(self) -> str:
        """The spec text's identity: what a run records, and a delta requires unchanged."""
        import hashlib

        return hashlib.sha256(self.text.encode()).hexdigest()

    def issue(self, path: PathT, message: str) -> SpecIssue:
        """A located issue about ``path`` (used by checks that run after loading)."""
        pos = self.positions.locate(path)
        return SpecIssue(
            self.source,
            format_path(path),
            message,
            pos[0] if pos else None,
            pos[1] if pos else None,
        )

    def located(self, error: SpecError) -> SpecError:
        """``error`` with each issue that code knowing only the spec's model raised (its
        source ``"spec"``: a query DuckDB cannot bind, a filter Spark cannot compare) placed
        at its field in this file, as the spec's own checks report theirs."""
        if all(issue.source != "spec" for issue in error.issues):
            return error
        paths = {format_path(path): path for path in self.positions.marks}
        return SpecError(
            [
                self.issue(paths.get(i.path) or tuple(i.path.split(".")), i.message) if i.source == "spec" else i
                for i in error.issues
            ]
        )


class _Bail(Exception):
    """Stop composing: the document itself is unusable (already recorded as an issue)."""


class _Builder:
    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.positions = Positions()
        self.issues: list[SpecIssue] = []
        self.nodes = 0
        self.constructor = yaml.constructor.SafeConstructor()
        #: path -> (text as written, text after ${VAR} expansion)
        self.expanded: dict[PathT, tuple[str, str]] = {}

    def add(self, mark: yaml.Mark | None, path: PathT, message: str) -> None:
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        self.issues.append(SpecIssue(self.source, format_path(path), message, line, col))

    def build(self, node: yaml.Node, path: PathT, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.add(
                node.start_mark,
                path,
                f"document expands to more than {MAX_NODES} nodes (an alias/anchor bomb?); refusing to load it",
            )
            raise _Bail
        if depth > MAX_DEPTH:
            self.add(node.start_mark, path, f"nested deeper than {MAX_DEPTH} levels")
            raise _Bail
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.positions.marks[(*path, i)] = (
                    item.start_mark.line + 1,
                    item.start_mark.column + 1,
                )
                items.append(self.build(item, (*path, i), depth + 1))
            return items
        value = self.constructor.construct_object(node, deep=True)
        if isinstance(value, str):
            value = self._interpolate(value, node.start_mark, path)
        return value

    def _mapping(self, node: yaml.MappingNode, path: PathT, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        explicit: set[str] = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for m in merged:
                    built = self.build(m, path, depth + 1)
                    if not isinstance(built, dict):
                        self.add(m.start_mark, path, "a merge key (<<) needs a mapping")
                        continue
                    for k, v in built.items():
                        out.setdefault(k, v)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.add(key_node.start_mark, path, "mapping keys must be plain strings")
                continue
            key = str(key_node.value)
            if key in explicit:
                self.add(key_node.start_mark, (*path, key), f"duplicate key {key!r} in one mapping")
                continue
            explicit.add(key)
            self.positions.marks[(*path, key)] = (
                key_node.start_mark.line + 1,
                key_node.start_mark.column + 1,
            )
            out[key] = self.build(value_node, (*path, key), depth + 1)
        return out

    def _interpolate(self, value: str, mark: yaml.Mark, path: PathT) -> str:
        if "$" not in value:
            return value
        expands = any(m.group(0) != "$${" for m in _ENV_RE.finditer(value))
        if expands and not expandable(path):
            self.add(
                mark,
                path,
                "${...} is not expanded in this field (only in: " + ", ".join(EXPANDABLE_FIELDS) + "); "
                "write $${ for a literal ${",
            )
            return ""

        def repl(m: re.Match[str]) -> str:
            if m.group(0) == "$${":
                return "${"
            name, default = m.group(1), m.group(2)
            if name in self.env:
                return self.env[name]
            if name in getattr(self.env, "withheld", ()):  # set, but not for specs: refused, not defaulted
                self.add(
                    mark,
                    path,
                    f"environment variable {name} is not one specs may read (used as ${{{name}}}); the operator "
                    "exposes variables to specs with BULLDOZER_SPEC_VARIABLES",
                )
                return ""
            if default is not None:
                return default
            self.add(mark, path, f"environment variable {name} is not set (used as ${{{name}}})")
            return ""

        expanded = _ENV_RE.sub(repl, value)
        if expands:
            self.expanded[path] = (value, expanded)
        return expanded

    def scrub(self, issue: SpecIssue) -> SpecIssue:
        """``issue`` without any value that came from expansion (it may be a secret): the
        field's ``${VAR}`` text stands where the value would."""
        message = issue.message
        for raw, expanded in self.expanded.values():
            if expanded:
                for shown in (repr(expanded)[1:-1], expanded):
                    message = message.replace(shown, raw)
        return (
            SpecIssue(issue.source, issue.path, message, issue.line, issue.column)
            if message != issue.message
            else issue
        )


_OPEN = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _too_deep(text: str, loader: type[Any] = yaml.SafeLoader) -> yaml.Mark | None:
    """Where the text nests deeper than MAX_DEPTH collections, found by a scanner (a loop)
    before a composer (a recursion, which a deep document overflows) runs; None when it does
    not (a scanner error is left for the parse to report)."""
    depth = 0
    try:
        for token in yaml.scan(text, Loader=loader):
            if isinstance(token, _OPEN):
                depth += 1
                if depth > MAX_DEPTH:
                    mark: yaml.Mark = token.start_mark
                    return mark
            elif isinstance(token, _CLOSE):
                depth -= 1
    except yaml.YAMLError:
        return None
    return None


#: libyaml's parser, where PyYAML was built with it (its wheels are)
_C_LOADER: type[Any] | None = getattr(yaml, "CSafeLoader", None)


def _fast_node(text: str) -> yaml.Node | None:
    """The document's root node as libyaml composes it (the nodes, marks and tags PyYAML's
    own parser gives a valid document), or None whenever anything is off (no libyaml, a
    character YAML does not allow, nesting past MAX_DEPTH, any YAML error, no document):
    PyYAML's own parser then reads the text again and says what is wrong, as it always has.
    In a forked warm run the pure-Python scan and composition of a spec took 3-4 ms of the
    start, libyaml's 0.3-0.7 ms (this machine, running slow)."""
    if _C_LOADER is None or yaml.reader.Reader.NON_PRINTABLE.search(text) or _too_deep(text, _C_LOADER) is not None:
        return None
    loader = _C_LOADER(text)
    try:
        node: yaml.Node | None = loader.get_single_node()
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()
    return node


def _parse(text: str, source: str, env: Mapping[str, str]) -> tuple[Any, _Builder]:
    builder = _Builder(source, env)
    node = _fast_node(text)
    if isinstance(node, yaml.MappingNode):
        return _built(node, builder)
    if not text.strip():
        builder.add(None, (), "the file is empty; a job spec is a YAML mapping")
        return None, builder
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        where = yaml.Mark(source, exc.position, line - 1, column - 1, None, 0)
        builder.add(where, (), f"character U+{code:04X} is not allowed in YAML (is this a text file?)")
        return None, builder
    too_deep = _too_deep(text)
    if too_deep is not None:
        builder.add(too_deep, (), f"nested deeper than {MAX_DEPTH} levels")
        loader.dispose()
        return None, builder
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        builder.add(exc.problem_mark or exc.context_mark, (), f"YAML syntax error: {yaml_problem(exc)}")
        return None, builder
    except yaml.YAMLError as exc:
        builder.add(None, (), f"YAML error: {yaml_problem(exc)}")
        return None, builder
    finally:
        loader.dispose()
    if node is None:
        builder.add(None, (), "the file holds no document; a job spec is a YAML mapping")
        return None, builder
    if not isinstance(node, yaml.MappingNode):
        builder.add(node.start_mark, (), "the document root must be a mapping of sections")
        return None, builder
    return _built(node, builder)


def _built(node: yaml.MappingNode, builder: _Builder) -> tuple[Any, _Builder]:
    builder.positions.marks[()] = (node.start_mark.line + 1, node.start_mark.column + 1)
    try:
        data = builder.build(node, (), 0)
    except _Bail:
        return None, builder
    return data, builder


# ------------------------------------------------------------ pydantic → issues


def _unwrap_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _unwrap_models(args[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _unwrap_models(a)]
    return []


def _model_at(path: PathT) -> type[BaseModel] | None:
    """The model whose fields live at ``path`` (for "did you mean" on unknown fields)."""
    model: type[BaseModel] = JobSpec
    for part in path:
        if isinstance(part, int):
            continue
        found = None
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                models = _unwrap_models(info.annotation)
                found = models[0] if models else None
        if found is None:
            return None
        model = found
    return model


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _message(err: Mapping[str, Any], path: PathT) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required section is missing" if len(path) == 1 else "required field is missing"
    if kind == "extra_forbidden":
        name = str(path[-1]) if path else "?"
        model = _model_at(path[:-1])
        known = _field_names(model) if model else []
        what = "section" if len(path) == 1 else "field"
        msg = f"unknown {what} {name!r}"
        if hint := did_you_mean(name, known):
            return f"{msg}; {hint}"
        return f"{msg}; expected one of: {', '.join(known)}" if known else msg
    msg = str(err["msg"])
    if kind in (
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "too_short",
        "too_long",
    ):
        value = err.get("input")
        shown = value if not isinstance(value, str | list | tuple) or len(value) < 40 else f"{len(value)} long"
        msg = f"{msg}, got {shown!r}" if not isinstance(shown, str) or shown == value else f"{msg} ({shown})"
    if kind.endswith("_type") or kind in ("int_from_float", "int_parsing", "literal_error"):
        value = err.get("input")
        msg = f"{msg}, got {value!r} ({type(value).__name__})"
    return msg


def _issues_from_validation(exc: ValidationError, builder: _Builder, source: str) -> list[SpecIssue]:
    issues = []
    for err in exc.errors():
        raw = tuple(err["loc"])
        path: PathT = tuple(p for p in raw if p != "[key]")
        # pydantic names the validator step in some locations; drop those parts.
        path = tuple(p for p in path if not (isinstance(p, str) and p.startswith("function-")))
        # a missing field has no position of its own: point at its parent
        pos = builder.positions.locate(path[:-1] if err["type"] == "missing" else path)
        issues.append(SpecIssue(source, format_path(path), _message(err, path), *(pos or (None, None))))
    return issues


def _refine(found: list[SpecIssue], earlier: list[SpecIssue]) -> list[SpecIssue]:
    """Drop follow-on noise: a field whose value an earlier issue already explained (an
    unset variable), and "missing X" next to "unknown field ...; did you mean X"."""
    explained = {i.path for i in earlier}
    suggested = set()
    for issue in found:
        m = re.search(r"did you mean '([^']+)'\?$", issue.message)
        if m:
            parent = issue.path.rsplit(".", 1)[0] if "." in issue.path else ""
            suggested.add(f"{parent}.{m.group(1)}" if parent else m.group(1))
    return [
        i for i in found if i.path not in explained and not (i.message.startswith("required") and i.path in suggested)
    ]


def _sort_key(issue: SpecIssue) -> tuple[int, int, str]:
    return (issue.line or 0, issue.column or 0, issue.path)


def load_spec_text(text: str, source: str = "<string>", env: Mapping[str, str] | None = None) -> LoadedSpec:
    """Validate spec text. Raises :class:`SpecError` with every issue found."""
    if len(text.encode("utf-8", errors="replace")) > MAX_SPEC_BYTES:
        raise SpecError([SpecIssue(source, "", f"spec is larger than {MAX_SPEC_BYTES} bytes")])
    data, builder = _parse(text, source, spec_environment() if env is None else env)
    issues = list(builder.issues)
    spec: JobSpec | None = None
    if data is not None:
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            issues.extend(_refine(_issues_from_validation(exc, builder, source), issues))
    if issues or spec is None:
        raise SpecError(sorted((builder.scrub(i) for i in issues), key=_sort_key))
    expanded = frozenset(format_path(path) for path in builder.expanded)
    return LoadedSpec(spec=spec, source=source, text=text, positions=builder.positions, expanded=expanded)


def _read_regular_file(path: Path, source: str) -> bytes:
    """The bytes of a regular file of at most MAX_SPEC_BYTES. Opened without blocking (a
    FIFO does not wait for a writer) and checked on the open descriptor, so a device, FIFO
    or socket — also behind a symlink — is refused before anything is read, and the limit
    holds while reading (a file that grows is not read past it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(str(path))
        if not stat.S_ISREG(mode):
            raise SpecError(
                [SpecIssue(source, "", "is not a regular file (a device, FIFO or socket); refusing to read it")]
            )
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                [SpecIssue(source, "", f"spec is over the size limit; the limit is {MAX_SPEC_BYTES} bytes")]
            )
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_spec(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> LoadedSpec:
    """Read and validate the spec file at ``path``."""
    source = str(path)
    try:
        raw = _read_regular_file(Path(path), source)
    except FileNotFoundError:
        raise SpecError([SpecIssue(source, "", "no such file")]) from None
    except IsADirectoryError:
        raise SpecError([SpecIssue(source, "", "is a directory, not a spec file")]) from None
    except PermissionError:
        raise SpecError([SpecIssue(source, "", "permission denied")]) from None
    except OSError as exc:
        raise SpecError([SpecIssue(source, "", f"cannot be read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([SpecIssue(source, "", f"not UTF-8 text (byte {exc.start} cannot be decoded)")]) from None
    return load_spec_text(text, source, env)
