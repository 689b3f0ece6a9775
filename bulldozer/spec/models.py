"""The ``MoveDataToKvDal`` job spec (``apiVersion: bulldozer/v1``) as frozen pydantic models.

Three sections, as in the original design, plus ``metadata``:

* ``data_movement`` — what to move: a table or a SQL query, key and value columns,
  renames, a filter, the duplicate-key policy and an optional pinned snapshot;
* ``key_value_dal`` — where to: the DAL endpoint, the alias consumers read, write tuning,
  retention and quality gates;
* ``bulldozer_protobuf`` — how the generated schema is named and written.

Every model forbids unknown fields. Rules that involve several fields raise a
``ValidationError`` whose locations point at the offending field, so the loader can name
its line.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from bulldozer.kv.v1 import shared
from bulldozer.names import ALIAS_PATTERN, describe_value

__all__ = [
    "API_VERSION",
    "EMBEDDED_CATALOG",
    "KIND",
    "CatalogConfig",
    "DataMovement",
    "DuplicateKeys",
    "JobSpec",
    "KeyValueDal",
    "Metadata",
    "ProtobufConfig",
    "ProtobufOutput",
    "QualityGates",
    "Retention",
    "ShadowRead",
    "Source",
    "WriteTuning",
    "format_duration",
    "parse_duration",
    "parse_time_limit",
]

API_VERSION = "bulldozer/v1"
KIND = "MoveDataToKvDal"

_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=True)

# ----------------------------------------------------------------- field helpers

PROTO_IDENT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PROTO_PACKAGE_PATTERN = r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$"
FIELD_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,127}$"
TABLE_PART_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENDPOINT_PATTERN = r"^(embedded|(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5})$"

#: Words protobuf reserves; a generated message or package part may not be one of them.
PROTO_KEYWORDS = frozenset(
    [
        "syntax",
        "import",
        "weak",
        "public",
        "package",
        "option",
        "message",
        "enum",
        "service",
        "rpc",
        "returns",
        "stream",
        "optional",
        "repeated",
        "required",
        "oneof",
        "map",
        "reserved",
        "to",
        "max",
        "extend",
        "extensions",
        "true",
        "false",
        "double",
        "float",
        "int32",
        "int64",
        "uint32",
        "uint64",
        "sint32",
        "sint64",
        "fixed32",
        "fixed64",
        "sfixed32",
        "sfixed64",
        "bool",
        "string",
        "bytes",
        "group",
        "edition",
    ]
)

#: Java's reserved words (its keywords, the literals, and ``_`` since Java 9): no part of a
#: Java package may be one (``bulldozer client --lang java`` puts the job's messages in one)
JAVA_KEYWORDS = frozenset(
    [
        "abstract",
        "assert",
        "boolean",
        "break",
        "byte",
        "case",
        "catch",
        "char",
        "class",
        "const",
        "continue",
        "default",
        "do",
        "double",
        "else",
        "enum",
        "extends",
        "final",
        "finally",
        "float",
        "for",
        "goto",
        "if",
        "implements",
        "import",
        "instanceof",
        "int",
        "interface",
        "long",
        "native",
        "new",
        "package",
        "private",
        "protected",
        "public",
        "return",
        "short",
        "static",
        "strictfp",
        "super",
        "switch",
        "synchronized",
        "this",
        "throw",
        "throws",
        "transient",
        "try",
        "void",
        "volatile",
        "while",
        "true",
        "false",
        "null",
        "_",
    ]
)

#: The classes Java's generated code nests in every message: no message may have the name
#: (a top-level one here, a nested one in bulldozer.schema.reader_names)
JAVA_NESTED_CLASSES = {"Builder": "builder class", "BuilderParent": "builder's parent interface"}
#: The first parts of the packages Java's generated code names types by (``java.lang.String``,
#: ``com.google.protobuf``, and the reader's ``io.grpc`` and ``dev.bulldozer.kv``): a message
#: so named would hide them
JAVA_PACKAGE_ROOTS = frozenset({"java", "com", "io", "dev"})

CRON_PRESETS = frozenset({"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@continuous"})


def _error(message: str, **ctx: Any) -> PydanticCustomError:
    """A spec error whose text is final (pydantic's templates know no ``!r``)."""
    return PydanticCustomError("bulldozer", "{msg}", {"msg": message.format(**ctx)})


def _matching(pattern: str, hint: str = "") -> Any:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if compiled.fullmatch(value) is None:
            extra = f" ({hint})" if hint else ""
            raise _error(
                "must match {pattern}{extra}, got {value}",
                pattern=pattern,
                extra=extra,
                value=describe_value(value),
            )
        return value

    return AfterValidator(check)


def _not_keyword(value: str) -> str:
    if value in PROTO_KEYWORDS:
        raise _error("{value!r} is a protobuf keyword; choose another name", value=value)
    return value


def _java_package(value: str) -> str:
    keywords = [part for part in value.split(".") if part in JAVA_KEYWORDS]
    if keywords:
        raise _error(
            "{value!r} has the Java keyword {word!r} as a part, which Java cannot compile (e.g. {word}_)",
            value=value,
            word=keywords[0],
        )
    return value


def _message_name(value: str) -> str:
    """A top-level message's name: besides protobuf's keywords, one Java can name a class by."""
    if value in JAVA_KEYWORDS:
        raise _error("{value!r} is a Java keyword, which Java cannot name a class by; choose another name", value=value)
    if value in JAVA_NESTED_CLASSES:
        raise _error(
            "{value!r} is the name of the {what} Java nests in every message; choose another name",
            value=value,
            what=JAVA_NESTED_CLASSES[value],
        )
    if value in JAVA_PACKAGE_ROOTS:
        raise _error(
            "{value!r} would hide Java's packages {value}.* from the generated code; choose another name", value=value
        )
    return value


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


ListOf = BeforeValidator(_as_tuple)  # YAML gives lists; the frozen models hold tuples

Identifier = Annotated[
    str,
    _matching(ALIAS_PATTERN, "a lowercase ASCII letter, then up to 62 lowercase letters, digits or _"),
]
FieldName = Annotated[str, _matching(FIELD_NAME_PATTERN, "a valid protobuf field name")]
ColumnName = Annotated[str, Field(min_length=1, max_length=255)]
ProtoMessageName = Annotated[
    str,
    Field(max_length=100),
    _matching(PROTO_IDENT_PATTERN),
    AfterValidator(_not_keyword),
    AfterValidator(_message_name),
]


def _check_package(value: str) -> str:
    for part in value.split("."):
        _not_keyword(part)
    return value


ProtoPackage = Annotated[
    str,
    Field(max_length=200),
    _matching(PROTO_PACKAGE_PATTERN, "dot-separated lowercase proto identifiers"),
    AfterValidator(_check_package),
]

_DURATION_RE = re.compile(r"(\d{1,15})(ms|s|m|h|d|w)")  # more digits than any bound: not a duration
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


#: the longest duration a spec may write (a grace period, a retry delay): beyond it a date
#: computed from one overflows, and no schedule waits that long
MAX_DURATION = timedelta(days=366)


_SECONDS_RE = re.compile(r"[0-9]+(\.[0-9]+)?")


def parse_duration(value: object) -> timedelta:
    """``90s``, ``15m``, ``24h``, ``7d``, ``1w``, combinations like ``1h30m``, or seconds;
    at most ``MAX_DURATION``."""
    if isinstance(value, timedelta):
        return _bounded(value.total_seconds())
    if isinstance(value, bool):
        raise _error("a duration like 24h, 30m, 7d or a number of seconds")
    if isinstance(value, int | float):
        if value < 0:
            raise _error("a duration cannot be negative")
        return _bounded(value)
    if isinstance(value, str):
        text = value.strip()
        if _SECONDS_RE.fullmatch(text):  # a number of seconds, as an environment variable writes one
            return _bounded(float(text))
        pos, total = 0, 0.0
        for m in _DURATION_RE.finditer(text):
            if m.start() != pos:
                break
            total += int(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return _bounded(total)
    raise _error(
        "{value!r} is not a duration; write e.g. 24h, 30m, 7d, 1h30m or a number of seconds",
        value=value,
    )


def _bounded(seconds: float) -> timedelta:
    if not seconds <= MAX_DURATION.total_seconds():  # also NaN
        raise _error("a duration is at most {days} days", days=MAX_DURATION.days)
    return timedelta(seconds=seconds)


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def format_duration(value: timedelta) -> str:
    """``value`` as a spec writes it (``parse_duration`` reads it back): ``2h``, ``1h30m``,
    ``45s``, ``250ms`` (to the millisecond)."""
    rest = round(value.total_seconds() * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def parse_time_limit(value: object) -> timedelta:
    """A time limit (``metadata.timeout``, ``BULLDOZER_RUN_TIMEOUT``): a duration
    (``parse_duration``) longer than 0 s."""
    limit = parse_duration(value)
    if not limit:
        raise _error("a time limit must be longer than 0 s")
    return limit


TimeLimit = Annotated[timedelta, BeforeValidator(parse_time_limit)]


def _check_schedule(value: str | None) -> str | None:
    if value is None or value in CRON_PRESETS:
        return value
    if value.startswith("@"):
        raise _error(
            "unknown schedule preset {value!r}; use one of {presets} or a cron expression",
            value=value,
            presets=", ".join(sorted(CRON_PRESETS)),
        )
    from croniter import croniter  # with dateutil, 9 ms of every command's start: only a schedule needs it

    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise _error(
            "{value!r} is not a cron expression (5 fields: minute hour day month weekday)",
            value=value,
        )
    from croniter import CroniterBadDateError

    try:  # a cron has no year: one that fires at all fires within any 28 years
        croniter(value, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        # Airflow takes it, and its scheduler then logs "Failed to fetch run info" and never runs the job
        raise _error("{value!r} never fires: no date has that day in that month", value=value) from None
    return value


Schedule = Annotated[str | None, AfterValidator(_check_schedule)]

#: an IANA time zone name as the tz database spells it ("Europe/Berlin", "UTC", "Etc/GMT+5")
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*")


def _check_timezone(value: str) -> str:
    """An IANA zone name the tz database knows (a name, never a path: checked before it is
    looked up, so a spec cannot have a file outside the database read)."""
    import zoneinfo

    if _ZONE_NAME.fullmatch(value) and len(value) <= 64:
        try:
            zoneinfo.ZoneInfo(value)
            return value
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder ("Europe")
            pass
    from bulldozer.names import did_you_mean

    hint = did_you_mean(value, zoneinfo.available_timezones(), fold_case=True)
    hint = f"; {hint}" if hint else " (an IANA name such as 'Europe/Berlin' or 'UTC')"
    raise _error("unknown time zone {value!r}{hint}", value=value, hint=hint)


TimeZone = Annotated[str, AfterValidator(_check_timezone)]


Located = list[tuple[tuple[str | int, ...], str, Any]]


def _details(located: Located) -> list[InitErrorDetails]:
    return [InitErrorDetails(type=_error("{msg}", msg=msg), loc=loc, input=value) for loc, msg, value in located]


def _raise_at(title: str, errors: Located) -> None:
    """Raise one ValidationError carrying several located errors (all reported at once)."""
    if errors:
        raise ValidationError.from_exception_data(title, _details(errors))


def _validate_with_checks(title: str, data: Any, handler: Any, checks: Any) -> Any:
    """Run field validation *and* the cross-field ``checks`` on the raw data, so a spec
    with a bad field still gets its cross-field errors reported in the same pass."""
    field_errors: list[InitErrorDetails] = []
    result = None
    try:
        result = handler(data)
    except ValidationError as exc:
        for err in exc.errors():
            kind = err["type"]
            err_type: Any = _error("{msg}", msg=err["msg"]) if kind == "bulldozer" else kind
            detail = InitErrorDetails(type=err_type, loc=tuple(err["loc"]), input=err.get("input"))
            if "ctx" in err and kind != "bulldozer":
                detail["ctx"] = err["ctx"]
            field_errors.append(detail)
    extra = checks(data) if isinstance(data, dict) else []
    if field_errors or extra:
        raise ValidationError.from_exception_data(title, field_errors + _details(extra))
    return result


def _str_list(value: object) -> list[str] | None:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _duplicates(items: tuple[str, ...] | list[str]) -> list[tuple[int, str]]:
    seen: set[str] = set()
    out = []
    for i, item in enumerate(items):
        if item in seen:
            out.append((i, item))
        seen.add(item)
    return out


# ----------------------------------------------------------------------- metadata


class Metadata(BaseModel):
    """Who owns the job and when it runs."""

    model_config = _FROZEN

    name: Identifier = Field(description="Job name; also the Airflow DAG id.")
    owner: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=4000)
    schedule: Schedule = Field(default=None, description="Cron expression or @preset.")
    timezone: TimeZone = Field(
        default="UTC", description="The IANA time zone the schedule's times are in, e.g. Europe/Berlin."
    )
    tags: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=64)], ...], ListOf] = ()
    retries: int = Field(default=2, ge=0, le=20, description="Times the scheduler retries a failed stage.")
    retry_delay: Duration = Field(default=timedelta(minutes=5), description="Wait before a retry, e.g. 5m.")
    timeout: TimeLimit | None = Field(
        default=None,
        description="The longest a run may take, e.g. 2h: past it the run is stopped and its version marked "
        "FAILED (the alias stays where it was); under the scheduler, the longest each stage may take. At most "
        "the operator's BULLDOZER_RUN_TIMEOUT, which applies when this is unset.",
    )


# ------------------------------------------------------------------ data_movement


#: The name of the embedded catalog: the SQLite catalog under ``$BULLDOZER_HOME``.
EMBEDDED_CATALOG = "lake"


class CatalogConfig(BaseModel):
    """Which Iceberg catalog holds the source: the operator's catalog of this ``name``
    (``BULLDOZER_CATALOGS``, a profile's ``catalogs``), else, for ``lake``, the embedded one —
    the SQLite catalog under ``$BULLDOZER_HOME`` (``.bulldozer/`` by default); any other name
    is refused (``bulldozer.warehouse.catalog.unknown_catalog``). ``properties`` define the
    catalog in the spec itself (any properties pyiceberg's ``load_catalog`` accepts:
    ``type``, ``uri``, ``warehouse``, …), which the operator must allow
    (``BULLDOZER_SPEC_CATALOGS=allow``; see ``bulldozer.warehouse.catalog.catalog_properties``)."""

    model_config = _FROZEN

    name: Annotated[str, _matching(TABLE_PART_PATTERN)] = EMBEDDED_CATALOG
    properties: dict[str, str] = Field(default_factory=dict)

    @property
    def defined_in_spec(self) -> bool:
        return bool(self.properties)


class Source(BaseModel):
    """Exactly one of ``table`` (``namespace.table``) or ``query`` (SQL)."""

    model_config = _FROZEN

    table: str | None = None
    query: str | None = Field(default=None, min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        if (self.table is None) == (self.query is None):
            which = "both" if self.table is not None else "neither"
            _raise_at(
                "Source",
                [((), f"give exactly one of 'table' or 'query' ({which} given)", None)],
            )
        if self.table is not None:
            parts = self.table.split(".")
            if len(parts) < 2 or any(not re.fullmatch(TABLE_PART_PATTERN, p) for p in parts):
                _raise_at(
                    "Source",
                    [
                        (
                            ("table",),
                            f"{self.table!r} is not a table identifier; write namespace.table",
                            self.table,
                        )
                    ],
                )
        return self


class DuplicateKeys(BaseModel):
    """What to do when two source rows share a key: ``fail`` (default), or ``keep_latest``
    (keep the row with the greatest ``order_by`` value; ties are an error)."""

    model_config = _FROZEN

    policy: Literal["fail", "keep_latest"] = "fail"
    order_by: ColumnName | None = None

    @model_validator(mode="after")
    def _order_by(self) -> DuplicateKeys:
        if self.policy == "keep_latest" and self.order_by is None:
            _raise_at("DuplicateKeys", [(("order_by",), "keep_latest needs order_by", None)])
        if self.policy == "fail" and self.order_by is not None:
            _raise_at(
                "DuplicateKeys",
                [(("order_by",), "order_by only applies to policy keep_latest", self.order_by)],
            )
        return self


def _duplicate_keys(value: object) -> object:
    return {"policy": value} if isinstance(value, str) else value


class DataMovement(BaseModel):
    """What data to move."""

    model_config = _FROZEN

    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    source: Source
    key_columns: Annotated[tuple[ColumnName, ...], ListOf] = Field(min_length=1, max_length=32)
    value_columns: Annotated[tuple[ColumnName, ...], ListOf] | None = Field(
        default=None, description="Value columns; default: every non-key column."
    )
    renames: dict[ColumnName, FieldName] = Field(default_factory=dict)
    filter: str | None = Field(default=None, min_length=1, max_length=10_000)
    duplicate_keys: Annotated[DuplicateKeys, BeforeValidator(_duplicate_keys)] = Field(default_factory=DuplicateKeys)
    snapshot_id: Annotated[int, Field(gt=0)] | None = None
    ref: Annotated[str, Field(min_length=1, max_length=255)] | None = Field(
        default=None,
        description=(
            "A branch or tag of the table to read (its snapshot at run start), instead of its current snapshot "
            "(the main branch): e.g. a write-audit-publish job's audited branch, or a tag its producer moves."
        ),
    )
    mode: Literal["full", "delta", "auto"] = Field(
        default="full",
        description=(
            "full: every run writes the whole table. delta: a run writes the live version plus the rows of the "
            "data files added and removed since its snapshot (a full run when that cannot be proven equivalent, "
            "saying why). auto: delta when possible and the change is under half the table, else full."
        ),
    )

    @model_validator(mode="wrap")
    @classmethod
    def _columns(cls, data: Any, handler: Any) -> Any:
        return _validate_with_checks("DataMovement", data, handler, _column_checks)


def _column_checks(data: dict[str, Any]) -> Located:
    """Cross-field rules of ``data_movement``, on the raw mapping (wrong types are skipped:
    field validation reports those)."""
    errs: Located = []
    key_list = _str_list(data.get("key_columns")) or []
    value_list = _str_list(data.get("value_columns"))
    for i, col in _duplicates(key_list):
        errs.append((("key_columns", i), f"{col!r} is listed twice", col))
    values = value_list or []
    for i, col in _duplicates(values):
        errs.append((("value_columns", i), f"{col!r} is listed twice", col))
    keys = set(key_list)
    for i, col in enumerate(values):
        if col in keys:
            errs.append(
                (
                    ("value_columns", i),
                    f"{col!r} is a key column; a column is a key or a value, not both",
                    col,
                )
            )
    renames = data.get("renames")
    if isinstance(renames, dict):
        targets: dict[str, str] = {}
        for src, dst in renames.items():
            if not isinstance(src, str) or not isinstance(dst, str):
                continue
            if value_list is not None and src not in keys and src not in values:
                errs.append(
                    (
                        ("renames", src),
                        f"renames {src!r}, which is neither a key nor a value column",
                        src,
                    )
                )
            if dst in targets:
                errs.append(
                    (
                        ("renames", src),
                        f"{src!r} and {targets[dst]!r} are both renamed to {dst!r}",
                        dst,
                    )
                )
            targets[dst] = src
            if value_list is not None:
                group = key_list if src in keys else values
                if dst in group and dst not in renames:
                    errs.append(
                        (
                            ("renames", src),
                            f"renaming {src!r} to {dst!r} clashes with the column {dst!r}",
                            dst,
                        )
                    )
    source = data.get("source")
    if isinstance(source, dict) and source.get("query") is not None and data.get("filter") is not None:
        errs.append(
            (
                ("filter",),
                "filter applies to a table source; with a query source, write the condition in the query's WHERE",
                data.get("filter"),
            )
        )
    for pin in ("snapshot_id", "ref"):
        if isinstance(source, dict) and source.get("query") is not None and data.get(pin) is not None:
            errs.append(
                (
                    (pin,),
                    f"{pin} pins a table source; a query source pins every table it reads at run start",
                    data.get(pin),
                )
            )
    if data.get("snapshot_id") is not None and data.get("ref") is not None:
        errs.append(
            (
                ("ref",),
                "snapshot_id and ref each choose the snapshot to read; give one of them",
                data.get("ref"),
            )
        )
    dup = data.get("duplicate_keys")
    if data.get("mode") == "delta":
        if isinstance(source, dict) and source.get("query") is not None:
            errs.append(
                (("mode",), "a delta is read from a table's file changes; a query source is loaded in full", "delta")
            )
        if dup == "keep_latest" or (isinstance(dup, dict) and dup.get("policy") == "keep_latest"):
            errs.append(
                (("mode",), "duplicate_keys keep_latest chooses among every row of a key; it needs a full run", "delta")
            )
    if isinstance(dup, dict) and isinstance(dup.get("order_by"), str) and dup["order_by"] in keys:
        errs.append(
            (
                ("duplicate_keys", "order_by"),
                f"{dup['order_by']!r} is a key column; order by a value column",
                dup["order_by"],
            )
        )
    return errs


# ------------------------------------------------------------------ key_value_dal


#: the most a spec's write may hold in memory at once: batches in flight x their size
MAX_IN_FLIGHT_BYTES = 1024 * 1024 * 1024


class WriteTuning(BaseModel):
    """How the loader writes into the DAL.

    The default batch (100 000 records, the DAL's ``limits.max_batch_records`` in
    proto/bulldozer/kv/v1/shared.yaml, and 16 MiB) is the largest the DAL takes in one call;
    the local engine's batches are also cut where its reader's are (65 536 rows). Against
    20 000 records and 4 MiB, in two bench runs back to back, end to end on 1 M flat rows:
    embedded 739 k -> 886 k rows/s, Redis 626 k -> 696 k, Cassandra 37.0 k -> 39.0 k; nested
    2 M rows 585 k -> 573 k (within the runs' spread). Redis gains most: each HSET puts about
    three times the fields into one of a version's hashes, so the server works on each
    hash's table while it is in cache (500 k rows, medians of 6 alternating: the server's
    CPU 0.38 -> 0.30 s, the load stage 0.465 -> 0.417 s)."""

    model_config = _FROZEN

    batch_size: Annotated[int, Field(ge=1, le=shared.LIMITS_MAX_BATCH_RECORDS)] = shared.LIMITS_MAX_BATCH_RECORDS
    max_batch_bytes: Annotated[int, Field(ge=1_024, le=64 * 1024 * 1024)] = 16 * 1024 * 1024
    in_flight_batches: Annotated[int, Field(ge=1, le=64)] = 4
    records_per_second: Annotated[int, Field(ge=1)] | None = None
    partitions: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        default=None,
        description="Spark write tasks (rows are spread over them by key); default: from the table's size.",
    )

    @model_validator(mode="after")
    def _bounded_in_flight(self) -> WriteTuning:
        # the batches in flight are held in memory by the loader (and by the DAL receiving
        # them): a spec may not make a scheduler's worker hold gigabytes (64 x 64 MiB = 4 GiB)
        held = self.in_flight_batches * self.max_batch_bytes
        if held > MAX_IN_FLIGHT_BYTES:
            _raise_at(
                "WriteTuning",
                [
                    (
                        ("in_flight_batches",),
                        f"in_flight_batches x max_batch_bytes is {held / 2**20:,.0f} MiB held in memory at once; "
                        f"at most {MAX_IN_FLIGHT_BYTES // 2**20:,} MiB (fewer batches in flight, or smaller ones)",
                        self.in_flight_batches,
                    )
                ],
            )
        return self


class Retention(BaseModel):
    """How many previous versions stay readable (for instant rollback), and for how long
    a retired version is kept before it is dropped."""

    model_config = _FROZEN

    keep_versions: Annotated[int, Field(ge=0, le=100)] = 2
    grace_period: Duration = timedelta(hours=24)


class QualityGates(BaseModel):
    """Checks a new version must pass before the alias moves to it."""

    model_config = _FROZEN

    min_rows: Annotated[int, Field(ge=0)] = 1
    max_row_count_change: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Largest allowed relative change of the row count vs the ACTIVE version (0.5 = ±50 %).",
    )
    max_null_fraction: dict[ColumnName, Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=dict)
    max_changed_fraction: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="Shadow read: largest allowed fraction of sampled keys both versions hold whose value changed.",
    )
    max_missing_fraction: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="Shadow read: largest allowed fraction of sampled keys only the live version holds.",
    )
    max_added_fraction: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None,
        description="Shadow read: largest allowed fraction of sampled keys only the new version holds.",
    )

    @property
    def needs_shadow_read(self) -> bool:
        return any(
            limit is not None
            for limit in (self.max_changed_fraction, self.max_missing_fraction, self.max_added_fraction)
        )


class ShadowRead(BaseModel):
    """Before the flip, read a seeded sample of keys from the new version and the live one and
    compare them (keys missing, keys added, values changed). The sample is chosen by key hash,
    so both versions are sampled at the same keys; the DAL reads each version once to choose it."""

    model_config = _FROZEN

    sample: Annotated[int, Field(ge=1, le=10_000)] = 1000
    seed: Annotated[int, Field(ge=0, lt=2**64)] = 0
    #: decoded field-level differences kept for this many sampled keys of each kind
    examples: Annotated[int, Field(ge=0, le=20)] = 3


class KeyValueDal(BaseModel):
    """Where the data goes."""

    model_config = _FROZEN

    #: None: the operator's (``--endpoint``, ``BULLDOZER_ENDPOINT``, the profile's, else embedded)
    endpoint: Annotated[str, _matching(ENDPOINT_PATTERN, "embedded or host:port")] | None = None
    alias: Identifier
    token: str | None = Field(default=None, repr=False, description="Bearer token, e.g. ${TOKEN}.")
    write: WriteTuning = Field(default_factory=WriteTuning)
    retention: Retention = Field(default_factory=Retention)
    quality_gates: QualityGates = Field(default_factory=QualityGates)
    #: None: no shadow read, unless a quality gate needs one (then with the defaults)
    shadow_read: ShadowRead | None = None

    @property
    def shadow_read_settings(self) -> ShadowRead | None:
        """The shadow read to run before the flip, if any."""
        if self.shadow_read is None and self.quality_gates.needs_shadow_read:
            return ShadowRead()
        return self.shadow_read


# -------------------------------------------------------------- bulldozer_protobuf


def _inside_the_spec_folder(value: str) -> str:
    """A folder below the spec file's own: a spec is untrusted, and ``bulldozer proto
    --write`` writes there (where a symbolic link leads elsewhere, it refuses at writing)."""
    path = value.replace("\\", "/")
    if path.startswith(("/", "~")) or ".." in path.split("/") or "\x00" in path or re.match(r"^[A-Za-z]:", path):
        raise _error(
            "must be a folder inside the spec's own folder (relative, no '..'), got {value}",
            value=describe_value(value),
        )
    return value


class ProtobufOutput(BaseModel):
    """Where ``bulldozer proto --write`` writes the generated files (``directory``, relative
    to the spec file's folder and inside it), and the per-language options written into the
    .proto."""

    model_config = _FROZEN

    directory: Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_inside_the_spec_folder)] = (
        "build/proto"
    )
    java_package: Annotated[str, _matching(PROTO_PACKAGE_PATTERN), AfterValidator(_java_package)] | None = None
    go_package: Annotated[str, Field(pattern=r"^[A-Za-z0-9_./;-]+$", max_length=300)] | None = None


class ProtobufConfig(BaseModel):
    """Names of the generated protobuf package and messages."""

    model_config = _FROZEN

    package: ProtoPackage
    key_message: ProtoMessageName = "KeyMessage"
    value_message: ProtoMessageName = "ValueMessage"
    output: ProtobufOutput = Field(default_factory=ProtobufOutput)

    @model_validator(mode="after")
    def _distinct(self) -> ProtobufConfig:
        if self.key_message == self.value_message:
            _raise_at(
                "ProtobufConfig",
                [
                    (
                        ("value_message",),
                        "key and value messages need different names",
                        self.value_message,
                    )
                ],
            )
        for one, other in ((self.key_message, self.value_message), (self.value_message, self.key_message)):
            if one == other + "OrBuilder":
                field = "key_message" if one == self.key_message else "value_message"
                _raise_at(
                    "ProtobufConfig",
                    [((field,), f"is the name of Java's interface for the message {other}; choose another name", one)],
                )
        return self


# ------------------------------------------------------------------------ the spec


class JobSpec(BaseModel):
    """A whole ``MoveDataToKvDal`` job."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    api_version: Literal["bulldozer/v1"] = Field(alias="apiVersion")
    kind: Literal["MoveDataToKvDal"]
    metadata: Metadata
    data_movement: DataMovement
    key_value_dal: KeyValueDal
    bulldozer_protobuf: ProtobufConfig

    @model_validator(mode="wrap")
    @classmethod
    def _cross_sections(cls, data: Any, handler: Any) -> Any:
        return _validate_with_checks("JobSpec", data, handler, _section_checks)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def alias(self) -> str:
        return self.key_value_dal.alias


def _section_checks(data: dict[str, Any]) -> Located:
    errs: Located = []
    dm, kv = data.get("data_movement"), data.get("key_value_dal")
    if not isinstance(dm, dict) or not isinstance(kv, dict):
        return errs
    values = _str_list(dm.get("value_columns"))
    gates = kv.get("quality_gates")
    nulls = gates.get("max_null_fraction") if isinstance(gates, dict) else None
    if values is not None and isinstance(nulls, dict):
        known = set(_str_list(dm.get("key_columns")) or []) | set(values)
        for col in nulls:
            if col not in known:
                errs.append(
                    (
                        ("key_value_dal", "quality_gates", "max_null_fraction", col),
                        f"{col!r} is not one of the job's columns",
                        col,
                    )
                )
    return errs
