"""The one exception tree of Bulldozer.

Every error a user can cause or meet derives from :class:`BulldozerError`. Each class
names the gRPC status code it travels as (``grpc_code``, the name of a
``grpc.StatusCode`` member), so the KV DAL server maps an exception to a status and the
client maps it back to the *same* class (the class name rides along in the trailing
metadata key ``bulldozer-error``; the status code alone picks the family's base class).

This module imports nothing heavy: it is safe to import from anywhere.

Tree::

    BulldozerError
    ├── SpecError                  a job spec is invalid (carries every issue found)
    ├── CatalogError               the warehouse catalog or a table cannot be used
    │   └── TableNotFoundError
    ├── SchemaError                a table cannot be mapped to protobuf
    │   └── IncompatibleSchemaError    a new schema would break existing readers
    ├── KvError                    raised by the KV DAL (server, client, engines)
    │   ├── InvalidArgumentError       malformed request, bad name, empty key
    │   │   └── InvalidNameError
    │   ├── NamespaceNotFoundError
    │   ├── NamespaceExistsError
    │   ├── NamespaceStateError        wrong lifecycle state for the operation
    │   ├── AliasNotFoundError
    │   ├── AliasConflictError         lost compare-and-set
    │   ├── AliasPinnedError           an operator pinned the alias
    │   ├── ResourceExhaustedError     size limits, full disk / map
    │   ├── BackendUnavailableError    server or storage engine not reachable
    │   ├── ForeignDataError           the engine's keyspace / prefix holds data Bulldozer did not write
    │   ├── UnreadableRecordError      a stored record does not parse with its version's schema
    │   ├── UnauthenticatedError
    │   └── PermissionDeniedError
    └── LoadError                  a run failed while loading or verifying
        ├── SourceDataError            the source rows break a rule (null / duplicate key)
        │   ├── DuplicateKeyError
        │   └── UnreadableFilesError   files the local reader cannot read (Avro) or apply exactly (equality deletes)
        ├── VerificationError          counts / digests differ from what the DAL acknowledged
        └── QualityGateError           a quality gate of the spec refused the version
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "AliasConflictError",
    "AliasNotFoundError",
    "AliasPinnedError",
    "BackendUnavailableError",
    "BulldozerError",
    "CatalogError",
    "DalBusyError",
    "DuplicateKeyError",
    "ForeignDataError",
    "IncompatibleSchemaError",
    "InvalidArgumentError",
    "InvalidNameError",
    "KvError",
    "LoadError",
    "NamespaceExistsError",
    "NamespaceNotFoundError",
    "NamespaceStateError",
    "PermissionDeniedError",
    "QualityGateError",
    "ResourceExhaustedError",
    "RetentionError",
    "SchemaError",
    "SourceDataError",
    "SpecError",
    "SpecIssue",
    "TableNotFoundError",
    "ToolchainError",
    "UnauthenticatedError",
    "UnimplementedError",
    "UnreadableFilesError",
    "UnreadableRecordError",
    "VerificationError",
    "error_class_by_name",
    "error_class_for_code",
]


class BulldozerError(Exception):
    """Base of every Bulldozer error. ``str(err)`` is one line a user can act on."""

    grpc_code: ClassVar[str] = "UNKNOWN"
    #: Process exit code the CLI uses for this error family.
    exit_code: ClassVar[int] = 1
    #: Whether trying the same step again can succeed. False where the failure is a property
    #: of the spec, the source data, the schema or a rule of the store (an invalid spec, a
    #: breaking change, duplicate keys, a refused gate...): a scheduler fails such a task at
    #: once instead of retrying it (bulldozer.schedule.airflow_dags).
    retryable: ClassVar[bool] = True


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a job spec, with where it is."""

    source: str
    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        field = f" {self.path}:" if self.path else ""
        return f"{where}:{field} {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.source,
            "line": self.line,
            "column": self.column,
            "field": self.path,
            "message": self.message,
        }


class SpecError(BulldozerError):
    """A job spec is invalid. ``issues`` holds every problem found, not only the first."""

    grpc_code = "INVALID_ARGUMENT"
    exit_code = 2
    retryable = False

    def __init__(self, issues: list[SpecIssue] | str) -> None:
        # a str: the issues as another process wrote them (e.g. Spark's Python worker)
        self.issues = [] if isinstance(issues, str) else list(issues)
        text = issues if isinstance(issues, str) else "\n".join(str(i) for i in self.issues)
        super().__init__(text or "invalid job spec")


# ------------------------------------------------------------------------ catalog


class CatalogError(BulldozerError):
    """The warehouse catalog cannot be opened, or a table in it cannot be used."""

    grpc_code = "FAILED_PRECONDITION"


class TableNotFoundError(CatalogError):
    """The source table (or its namespace) does not exist in the catalog."""

    grpc_code = "NOT_FOUND"


# ------------------------------------------------------------------------- schema


class SchemaError(BulldozerError):
    """A table's schema cannot be turned into protobuf messages (unsupported type, a name
    clash after sanitizing, a key column of a type whose bytes are not deterministic)."""

    grpc_code = "INVALID_ARGUMENT"
    retryable = False


class IncompatibleSchemaError(SchemaError):
    """A newly generated schema would break readers of the previous one. ``differences``
    lists every refused change."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 3

    def __init__(self, message: str, differences: list[str] | None = None) -> None:
        self.differences = list(differences or [])
        super().__init__(message)


class ToolchainError(SchemaError):
    """A tool that client generation needs (Maven, the Go toolchain, a protoc plugin) is
    missing or failed; the message says which and how to get it."""

    grpc_code = "FAILED_PRECONDITION"


# ------------------------------------------------------------------------- KV DAL


class KvError(BulldozerError):
    """Raised by the KV DAL: its server, its client and its storage engines."""

    grpc_code = "INTERNAL"


class InvalidArgumentError(KvError):
    """A malformed request: an empty key, an unknown field value, a bad page token."""

    grpc_code = "INVALID_ARGUMENT"
    retryable = False


class InvalidNameError(InvalidArgumentError):
    """A namespace, alias or job name is not a valid identifier."""


class NamespaceNotFoundError(KvError):
    """The namespace (or the version an alias was resolved to) does not exist or was dropped."""

    grpc_code = "NOT_FOUND"


class NamespaceExistsError(KvError):
    """A namespace with that name already exists."""

    grpc_code = "ALREADY_EXISTS"


class NamespaceStateError(KvError):
    """The namespace is in the wrong lifecycle state for the operation (e.g. a write to a
    SEALED version, pointing an alias at a LOADING one)."""

    grpc_code = "FAILED_PRECONDITION"
    retryable = False


class SchemaMismatchError(KvError):
    """A read built for one schema generation of an alias addressed a version of another
    (a deliberate breaking change, ``bulldozer run --allow-breaking``): refused instead of
    being misread."""

    grpc_code = "FAILED_PRECONDITION"
    retryable = False


class AliasNotFoundError(KvError):
    """The alias has never been pointed at a version."""

    grpc_code = "NOT_FOUND"


class AliasPinnedError(KvError):
    """The alias is pinned by an operator: runs build and verify versions but do not flip."""

    grpc_code = "FAILED_PRECONDITION"


class AliasConflictError(KvError):
    """A compare-and-set on an alias lost: the alias no longer points where the caller
    expected (another run or an operator moved it first)."""

    grpc_code = "ABORTED"


class ResourceExhaustedError(KvError):
    """A size limit was hit: key, value or batch too large, or the engine's storage is full."""

    grpc_code = "RESOURCE_EXHAUSTED"


class DalBusyError(ResourceExhaustedError):
    """The DAL is taking as many writes at once as it takes (``serve --max-writes-in-flight``):
    this one was refused before it was stored, and can be sent again after a pause (the
    client's batch writer does)."""


class BackendUnavailableError(KvError):
    """The DAL server or its storage engine cannot be reached."""

    grpc_code = "UNAVAILABLE"


class ForeignDataError(KvError):
    """The keyspace or key prefix configured for an engine already holds data that
    Bulldozer did not write; it is left untouched and the engine refuses to start."""

    grpc_code = "FAILED_PRECONDITION"
    retryable = False


class UnreadableRecordError(KvError):
    """A record a version holds does not parse with the version's own stored schema (text
    that is not UTF-8, say): written by another tool, or by a release that did not check
    its source's values. A run refuses such values (SourceDataError) before they are stored."""

    grpc_code = "DATA_LOSS"
    retryable = False


class StoreDamagedError(KvError):
    """The store's own files are not what its engine wrote (a page of the wrong type or
    missing: a failing disk, a copy taken while it was written, another program's write):
    what it holds cannot be trusted, and nothing more is written to it."""

    grpc_code = "DATA_LOSS"
    retryable = False


class StoreSettingsError(KvError):
    """The storage engine is set up in a way that breaks a promise of versions (e.g. a Redis
    that evicts keys when full would lose a live version's records); the DAL refuses to use
    it until the setting is changed."""

    grpc_code = "FAILED_PRECONDITION"
    retryable = False


class UnauthenticatedError(KvError):
    """The caller did not prove who it is (missing or unknown credentials)."""

    grpc_code = "UNAUTHENTICATED"
    retryable = False


class PermissionDeniedError(KvError):
    """The caller is known but may not perform this operation on this alias."""

    grpc_code = "PERMISSION_DENIED"
    retryable = False


class UnimplementedError(KvError):
    """The DAL does not serve this call (a release older than the client's)."""

    grpc_code = "UNIMPLEMENTED"
    retryable = False


# --------------------------------------------------------------------------- load


class LoadError(BulldozerError):
    """A run failed while loading or verifying a version. The alias was not moved."""

    grpc_code = "ABORTED"


class SourceDataError(LoadError):
    """The source rows break a rule of the spec (e.g. a null in a key column)."""

    retryable = False


class UnreadableFilesError(SourceDataError):
    """The table's snapshot has files pyiceberg's reader cannot read (Avro data files) or
    equality deletes Bulldozer cannot apply exactly (``warehouse.equality_deletes``: read
    without them, rows the table deleted would be loaded); Iceberg's own reader, the Spark
    engine's, can. ``why``: what the snapshot has;
    ``remedy``: the Spark SQL that rewrites them away."""

    why: str = ""
    remedy: str = ""


class DuplicateKeyError(SourceDataError):
    """Two source rows share a key and the spec's ``duplicate_keys`` policy is ``fail``."""


class VerificationError(LoadError):
    """What the runner sent differs from what the DAL acknowledged (count or digest)."""

    retryable = False


class QualityGateError(LoadError):
    """A quality gate of the spec refused the new version."""

    retryable = False


class RetentionError(BulldozerError):
    """The run's version is live (the flip succeeded), but retention failed afterwards:
    older versions were not dropped. Exit code 4, so a script can tell it from a failed run."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 4


def _all_subclasses(cls: type[BulldozerError]) -> list[type[BulldozerError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def error_class_by_name(name: str) -> type[BulldozerError] | None:
    """The exception class of this tree called ``name`` (for the client's mapping)."""
    for cls in _all_subclasses(BulldozerError):
        if cls.__name__ == name:
            return cls
    return None


def error_class_for_code(code: str) -> type[BulldozerError]:
    """The exception a KV DAL status code stands for when the server named none: the first
    class of the ``KvError`` tree declared with that ``grpc_code`` (so the mapping is the
    classes' own codes, written once), else ``KvError``."""
    for cls in _all_subclasses(KvError):
        if cls.grpc_code == code:
            return cls
    return KvError
