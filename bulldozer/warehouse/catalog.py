"""Open the Iceberg catalog a job spec names.

The embedded default is pyiceberg's ``SqlCatalog`` on a SQLite file plus a local warehouse
folder, both under ``$BULLDOZER_HOME`` (``.bulldozer/`` in the working directory by
default). Spark's Iceberg runtime opens the very same catalog as a JDBC catalog on that
SQLite file, which works because both use the same catalog name (``lake``).

Any other catalog is the operator's (``catalog_properties``): a spec names it, and may not
define one, unless the operator allows it.

How a table's files are read (which FileIO, its endpoints, signers and credentials) is its
catalog's configuration, never the table's own properties (``table_io_refusal``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bulldozer.errors import BulldozerError, CatalogError, TableNotFoundError
from bulldozer.names import did_you_mean
from bulldozer.redaction import first_line, shown_url, visible, without_secrets
from bulldozer.spec.models import EMBEDDED_CATALOG, CatalogConfig
from bulldozer.warehouse import catalog_tls
from bulldozer.warehouse.files import reading_metadata, unreadable_metadata

log = logging.getLogger(__name__)
T = TypeVar("T")

if TYPE_CHECKING:
    from bulldozer.errors import SpecIssue
    from bulldozer.spec.loader import LoadedSpec

__all__ = [
    "bulldozer_home",
    "catalog_issues",
    "catalog_properties",
    "embedded_catalog_properties",
    "load_source_table",
    "load_table",
    "not_made",
    "open_catalog",
    "pinned_snapshot",
    "pyiceberg_configuration",
    "read_snapshot",
    "ref_issue",
    "require_catalog_made",
    "spec_catalog_refusal",
    "table_io_refusal",
    "unknown_catalog",
]

#: The namespaces of pyiceberg's FileIO properties (``pyiceberg.io``): which code reads a
#: table's files (``py-io-impl``, ``s3.retry-strategy-impl``), where they are fetched or
#: signed (endpoints, proxies, signer URIs, hosts) and with which credentials.
FILE_IO_PREFIXES = ("py-io-impl", "client.", "s3.", "gcs.", "adls.", "hdfs.", "hf.", "oss.")

#: why a spec may not define a catalog itself (``spec_catalog_refusal``)
_SPEC_CATALOG = (
    "a spec may not define its own catalog (pyiceberg would reach whatever its properties name: any file, any "
    "installed module, any host, with this machine's cloud credentials): name one of the operator's catalogs "
    "({known}), or have the operator allow spec catalogs (BULLDOZER_SPEC_CATALOGS=allow)"
)


def bulldozer_home(home: str | os.PathLike[str] | None = None) -> Path:
    """Where embedded state lives: ``home``, else ``$BULLDOZER_HOME``, else ``./.bulldozer``."""
    from bulldozer.settings import load_settings

    return load_settings().home_path(home)


def not_made(path: Path) -> bool:
    """Whether ``path`` in a home (its store, its catalog) does not exist yet; a home that is
    a file is the OSError it is, not a home where nothing was made."""
    try:
        path.stat()
    except FileNotFoundError:
        return True
    return False


def require_catalog_made(config: CatalogConfig, home: str | os.PathLike[str] | None = None) -> None:
    """A CatalogError when ``config`` names the embedded catalog and none was made under the
    home: what ``open_catalog(create=False)`` would say, asked before anything is opened. A
    catalog the spec may not name is left to the spec's checks, which say why in their words."""
    try:
        props = catalog_properties(config)
    except CatalogError:
        return
    if props is None:
        _require_made(bulldozer_home(home))


def _require_made(root: Path) -> None:
    if not_made(root / "catalog.db"):
        raise CatalogError(
            f"there is no embedded catalog under {visible(str(root))}: no table was made there "
            "(`bulldozer warehouse sample` makes one); check --home / BULLDOZER_HOME, or name a catalog "
            "the operator configured (BULLDOZER_CATALOGS)"
        )


def embedded_catalog_properties(home: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The embedded catalog's pyiceberg properties: its SQLite file and its warehouse folder
    under the home, each path written as its reader parses it back. SQLAlchemy decodes the
    database part of its URL: the file's path is percent-encoded there (it was not: a home
    with ``%`` in its name opened another file, one with ``?`` made its database outside
    the home). pyiceberg (and Hadoop, for Spark) take a ``file://`` location's path as it
    stands: the warehouse's is not encoded (it was, ``Path.as_uri``: a home with a space, a
    brace or a letter outside ASCII had its tables' files written beside it, in a folder
    named by the encoded path, ``a%20b`` for ``a b``). A ``#`` or ``?`` ends a location's
    path for pyiceberg, so a home with one is refused."""
    from urllib.parse import quote

    root = bulldozer_home(home)
    if found := sorted({c for c in str(root) if c in "#?"}):
        raise CatalogError(
            f"the embedded catalog cannot live under {str(root)!r}: Iceberg's file locations are URIs, in which "
            f"{' and '.join(map(repr, found))} would end the path; choose a home without them (--home, BULLDOZER_HOME)"
        )
    return {
        "type": "sql",
        "uri": f"sqlite:///{quote(str(root / 'catalog.db'), safe='/')}",
        "warehouse": f"file://{root / 'warehouse'}",
    }


def spec_catalog_refusal(config: CatalogConfig) -> str | None:
    """Why the operator does not let a spec define its catalog as ``config`` does (None
    when it defines none, or the operator allows it: ``BULLDOZER_SPEC_CATALOGS``)."""
    from bulldozer.settings import load_settings

    settings = load_settings()
    if not config.defined_in_spec or settings.spec_catalogs == "allow":
        return None
    return _SPEC_CATALOG.format(known=", ".join(sorted(settings.catalogs)) or "the operator has configured none")


def unknown_catalog(config: CatalogConfig) -> str | None:
    """Why no catalog answers to ``config.name``, or None: a spec names the operator's
    catalog of that name or, for ``lake``, the embedded one. Another name opened the
    embedded SQLite file under it, where no table is: a misspelt ``prod`` failed with
    "table ... does not exist" as if the table were missing, and a name the operator forgot
    to configure read whatever the machine's embedded catalog held."""
    from bulldozer.settings import load_settings

    settings = load_settings()
    if config.defined_in_spec or config.name == EMBEDDED_CATALOG or config.name in settings.catalogs:
        return None
    known = sorted(settings.catalogs)
    hint = f"; {hint}" if (hint := did_you_mean(config.name, [*known, EMBEDDED_CATALOG])) else ""
    operator = f"the operator's ({', '.join(known)})" if known else "one the operator configured (there is none)"
    return (
        f"no catalog is named {config.name!r}: name {operator} or the embedded one ({EMBEDDED_CATALOG!r}); the "
        f"operator configures catalogs in BULLDOZER_CATALOGS or the profile's catalogs{hint}"
    )


def catalog_issues(loaded: LoadedSpec) -> list[SpecIssue]:
    """``spec_catalog_refusal`` and ``unknown_catalog`` of a loaded spec, as located issues
    (validate, submit, run)."""
    config = loaded.spec.data_movement.catalog
    issues = []
    if refused := spec_catalog_refusal(config):
        issues.append(loaded.issue(("data_movement", "catalog", "properties"), refused))
    if unknown := unknown_catalog(config):
        issues.append(loaded.issue(("data_movement", "catalog", "name"), unknown))
    return issues


def catalog_properties(config: CatalogConfig) -> dict[str, str] | None:
    """The pyiceberg properties the catalog ``config`` names opens with; None for the
    embedded catalog. A job spec is untrusted input: its catalog is the operator's of that
    name (``BULLDOZER_CATALOGS``, the profile's ``catalogs``), or the embedded one, and a
    spec's own ``properties`` are refused (CatalogError) unless the operator allows spec
    catalogs. A catalog a spec defined could make this process create files anywhere (a
    SQL catalog makes its tables in the SQLite file its ``uri`` names), import and call
    any installed module (``py-catalog-impl``, ``py-io-impl``), or reach any host with the
    machine's own cloud credentials (REST, S3, GCS, ADLS URIs)."""
    from bulldozer.settings import load_settings

    refused = spec_catalog_refusal(config)
    if refused is not None:
        raise CatalogError(f"data_movement.catalog.properties: {refused}")
    if config.defined_in_spec:
        return dict(config.properties)
    unknown = unknown_catalog(config)
    if unknown is not None:
        raise CatalogError(f"data_movement.catalog.name: {unknown}")
    operator = load_settings().catalogs.get(config.name)
    return dict(operator) if operator else None


def open_catalog(
    config: CatalogConfig | None = None, home: str | os.PathLike[str] | None = None, create: bool = True
) -> Any:
    """The pyiceberg catalog for ``config`` (``catalog_properties``: the operator's catalog of
    its name, else for ``lake`` the embedded one), whose tables cannot name the code that reads their
    files (``_no_table_file_io_code``). ``create`` False, for a reader: a home without an
    embedded catalog is a CatalogError, not a new empty catalog made there (a mistyped
    ``--home`` left one behind)."""
    config = config or CatalogConfig()
    props = catalog_properties(config)
    if props is None:
        root = bulldozer_home(home)
        if not create:
            _require_made(root)
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        props = embedded_catalog_properties(root)
    where = shown_url(props["uri"]) if "uri" in props else props.get("type", "?")
    try:
        catalog = answered(lambda: _catalog(config.name, props), f"catalog {config.name!r} at {where}")
    except CatalogError:
        raise
    except Exception as exc:  # pyiceberg raises many unrelated types here
        said = without_secrets(first_line(exc), props)  # pyiceberg's may repeat the uri, password and all
        if catalog_tls.failed_handshake(exc):
            said += f" (the TLS handshake failed: {', '.join(catalog_tls.SETTINGS)} say whom it trusts and who it is)"
        raise CatalogError(f"cannot open catalog {config.name!r} at {where}: {said}") from exc
    _no_table_file_io_code(catalog)
    return catalog


def pyiceberg_configuration(name: str) -> list[str]:
    """The keys pyiceberg's own configuration sets for catalog ``name`` — a ``.pyiceberg.yaml``
    in ``$PYICEBERG_HOME``, the home folder or the *working directory*, and ``PYICEBERG_*``
    variables — which Bulldozer does not use (``_catalog``); a CatalogError when that
    configuration does not parse (pyiceberg reads it as its catalog module is imported, and
    again as it scans: every pyiceberg use of this process would fail on it)."""
    from pyiceberg.utils.config import Config

    try:
        found = Config().get_catalog_config(name)
    except Exception as exc:  # strictyaml's errors (not imported here: a run defers it), a ValueError
        reason = " ".join(str(exc).split())
        raise CatalogError(
            "pyiceberg's own configuration (a .pyiceberg.yaml in $PYICEBERG_HOME, the home folder or the working "
            f"directory, or PYICEBERG_* variables) does not parse, and pyiceberg reads it on every use: {reason}"
        ) from None
    return sorted(found) if isinstance(found, dict) else []


def _say_unused_pyiceberg_configuration(name: str) -> None:
    """A warning naming the keys pyiceberg's own configuration sets for catalog ``name``,
    which Bulldozer does not use (``_catalog``)."""
    ignored = pyiceberg_configuration(name)
    if ignored:
        log.warning(
            "catalog %r: pyiceberg's own configuration (a .pyiceberg.yaml or PYICEBERG_CATALOG__%s__* variables) "
            "sets %s for it, which Bulldozer does not use: its catalogs are configured in BULLDOZER_CATALOGS",
            name,
            name.upper(),
            ", ".join(ignored),
        )


def _catalog(name: str, props: dict[str, str]) -> Any:
    """The pyiceberg catalog ``name`` made from ``props`` alone. pyiceberg's ``load_catalog``
    would merge its own configuration for that name into them (``pyiceberg_configuration``):
    a ``.pyiceberg.yaml`` in the working directory — a checkout of a repository of specs —
    could then set the catalog's FileIO to any installed module, its endpoints and its
    credentials, and the local engine would read with a catalog Spark's never sees.
    Bulldozer's catalogs are configured in one place (``BULLDOZER_CATALOGS``, a profile's
    ``catalogs``); keys found there for this name are named in a warning, not used."""
    import importlib

    _say_unused_pyiceberg_configuration(name)  # before pyiceberg.catalog's import reads it
    from pyiceberg.catalog import AVAILABLE_CATALOGS, PY_CATALOG_IMPL, TYPE, URI, CatalogType, infer_catalog_type

    if impl := props.get(PY_CATALOG_IMPL):  # the operator's own catalog class, as pyiceberg loads one
        module, _, cls = impl.rpartition(".")
        if not module:
            raise CatalogError(f"catalog {name!r}: py-catalog-impl must be module.Class, not {impl!r}")
        return getattr(importlib.import_module(module), cls)(name, **props)
    kind = CatalogType(props[TYPE].lower()) if props.get(TYPE) else infer_catalog_type(name, dict(props))
    if kind is None:
        raise CatalogError(f"catalog {name!r}: set its type (rest, sql, hive, glue, ...)")
    if kind in (CatalogType.REST, CatalogType.HIVE, CatalogType.SQL) and URI not in props:
        raise CatalogError(f"catalog {name!r} ({kind.value}) has no uri")
    catalog_tls.check(name, kind.value, props)  # a REST catalog's TLS settings, as pyiceberg takes them
    if kind == CatalogType.REST and catalog_tls.tls_settings(props):
        return catalog_tls.rest_catalog(name, props)
    return AVAILABLE_CATALOGS[kind](name, props)


def answered(call: Callable[[], T], who: str) -> T:
    """``call()`` (a call to a catalog), made on a thread of its own, or a CatalogError saying
    ``who`` did not answer once ``BULLDOZER_CATALOG_TIMEOUT`` seconds have passed: pyiceberg's
    REST catalog asks with no timeout, so a catalog that took the connection and never
    answered held ``validate --catalog``, a run and a scheduler's task for ever. What it
    raises is raised here."""
    from bulldozer.settings import load_settings

    timeout = load_settings().catalog_timeout
    outcome: list[Any] = []
    done = threading.Event()

    def ask() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=ask, name="catalog-call", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):  # a signal is heard within 0.5 s
        if time.monotonic() >= deadline:
            raise CatalogError(
                f"{who} did not answer within {timeout:g} s (BULLDOZER_CATALOG_TIMEOUT): is it up and reachable?"
            )
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    result: T = value
    return result


def table_io_refusal(identifier: str, properties: Mapping[str, str]) -> str | None:
    """Why Bulldozer does not read a table whose own properties configure how its files are
    read (``FILE_IO_PREFIXES``), or None. That is its catalog's configuration, the operator's:
    Iceberg's Java readers (Bulldozer's Spark engine among them) build a table's FileIO from
    the catalog's alone, but pyiceberg lets a table's properties override the catalog's
    (apache/iceberg-python#3931), so whoever can commit to a table could make this process
    import a module of its choice, or send its requests, signed with the operator's
    credentials, to a host of its choice."""
    found = sorted(k for k in properties if k.startswith(FILE_IO_PREFIXES))
    if not found:
        return None
    named = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (
        f"table {identifier!r} sets {named} in its own properties: how a table's files are read is its catalog's "
        "configuration (the operator's), never the table's; remove them from the table (Iceberg's Java readers "
        "ignore them too)"
    )


class _TableNamesFileIOCode(Exception):
    """A table's properties name code for its FileIO (``_no_table_file_io_code``)."""

    def __init__(self, properties: dict[str, str]) -> None:
        super().__init__(sorted(properties))
        self.properties = properties


def _no_table_file_io_code(catalog: Any) -> None:
    """Stop ``catalog`` from importing the code a table's properties name for its FileIO
    (``py-io-impl``, ``s3.retry-strategy-impl``) as it loads the table: pyiceberg builds the
    table's FileIO from the catalog's properties and the table's together, and imports what
    they name right there, before ``load_table`` could look at the table. A key the catalog
    sets itself to the same value is its own. ``Catalog._load_file_io`` is pyiceberg's one
    place where table properties reach a FileIO (every catalog type, REST's server config
    among them); ``test_security.py::test_a_table_cannot_choose_how_its_files_are_read``
    fails should a pyiceberg release move it. The FileIO built is a ``file_io.CheckedFileIO``:
    local files are checked as they are opened (the data files a run plans, where they lie)."""
    build = catalog._load_file_io

    def guarded(properties: Mapping[str, str] | None = None, location: str | None = None) -> Any:
        given = dict(properties or {})
        code = {
            k: v
            for k, v in given.items()
            if k.startswith(FILE_IO_PREFIXES) and k.endswith("impl") and catalog.properties.get(k) != v
        }
        if code:
            raise _TableNamesFileIOCode(code)
        from bulldozer.warehouse.file_io import checked_io

        return checked_io(build(given, location))  # local files checked as they are opened

    catalog._load_file_io = guarded


def load_table(catalog: Any, identifier: str) -> Any:
    """Load ``namespace.table``; a missing table or namespace is a TableNotFoundError, a table
    whose properties configure its FileIO a CatalogError (``table_io_refusal``)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        table = answered(lambda: catalog.load_table(identifier), f"the catalog, asked for table {identifier!r},")
    except _TableNamesFileIOCode as exc:
        raise CatalogError(table_io_refusal(identifier, exc.properties)) from None
    except (NoSuchTableError, NoSuchNamespaceError):
        known: list[str] = []

        def listed() -> None:
            for ns in catalog.list_namespaces():
                known.extend(".".join(t) for t in catalog.list_tables(ns))

        with contextlib.suppress(Exception):  # listing is only a hint
            answered(listed, "the catalog, asked for its tables,")
        hint = f" (tables: {', '.join(sorted(known)[:10])})" if known else ""
        raise TableNotFoundError(f"table {identifier!r} does not exist in the catalog{hint}") from None
    except BulldozerError:
        raise
    except Exception as exc:  # its metadata JSON damaged or gone: pyiceberg raises what its parser met
        raise unreadable_metadata(f"table {identifier!r}", exc) from exc
    refused = table_io_refusal(identifier, table.metadata.properties)
    if refused:  # its FileIO was built with them, and has read nothing yet
        raise CatalogError(refused)
    return table


def _embedded_metadata_location(
    config: CatalogConfig, home: str | os.PathLike[str] | None, identifier: str
) -> str | None:
    from bulldozer.warehouse.pyiceberg_fast import embedded_metadata_location

    return embedded_metadata_location(config.name, bulldozer_home(home), identifier)


def read_snapshot(table: Any, identifier: str, snapshot_id: int | None, ref: str | None = None) -> Any:
    """The snapshot of ``table`` a run reads: ``snapshot_id`` (the spec's pin), else the
    head of the branch or tag ``ref``, else the current one; a CatalogError saying which is
    missing, and why it may be."""
    if snapshot_id is not None or ref is not None:
        snapshot, missing = pinned_snapshot(table, identifier, snapshot_id, ref)
        if missing is not None:
            field, reason = missing
            raise CatalogError(f"data_movement.{field}: {reason}")
        return snapshot
    snapshot = table.current_snapshot()
    if snapshot is None:
        raise CatalogError(f"table {identifier!r} has no snapshot to read (is it empty?)")
    return snapshot


def pinned_snapshot(
    table: Any, identifier: str, snapshot_id: int | None, ref: str | None
) -> tuple[Any, tuple[str, str] | None]:
    """The snapshot a spec pins (``snapshot_id``, else the head of the branch or tag ``ref``)
    and None; or None and (the field, why the table has no such snapshot)."""
    if snapshot_id is not None:
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is not None:
            return snapshot, None
        current = table.current_snapshot()
        now = f"its current snapshot is {current.snapshot_id}" if current else "it has no snapshot at all"
        return None, (
            "snapshot_id",
            f"table {identifier!r} has no snapshot {snapshot_id} (it expired, or was never one of this table: a "
            f"table replaced under the same name starts anew); {now}",
        )
    assert ref is not None
    snapshot = table.snapshot_by_name(ref)
    return (snapshot, None) if snapshot is not None else (None, ("ref", ref_issue(table, identifier, ref)))


def ref_issue(table: Any, identifier: str, ref: str) -> str:
    """Why ``ref`` names no snapshot of ``table``, with the branches and tags it has."""
    refs = table.metadata.refs
    if ref in refs:  # its snapshot is gone from the metadata (a tool expired it under the ref)
        kind, snapshot = refs[ref].snapshot_ref_type, refs[ref].snapshot_id
        return f"table {identifier!r}'s {kind} {ref!r} points at snapshot {snapshot}, which the table no longer has"
    has = []
    for kind, plural in (("branch", "branches"), ("tag", "tags")):
        names = sorted(name for name, r in refs.items() if str(r.snapshot_ref_type) == kind)
        if names:
            more = f", … {len(names) - 10} more" if len(names) > 10 else ""
            has.append(f"{plural} {', '.join(map(repr, names[:10]))}{more}")
    return f"table {identifier!r} has no branch or tag {ref!r} (it has {'; '.join(has) or 'none'})"


def load_source_table(config: CatalogConfig, home: str | os.PathLike[str] | None, identifier: str) -> Any:
    """The table a run reads, read-only: from the embedded catalog, a ``StaticTable`` on the
    table's current metadata file, looked up in the catalog's SQLite file directly
    (``bulldozer.warehouse.pyiceberg_fast``: opening the ``SqlCatalog`` costs 0.2 s of
    SQLAlchemy imports, a tenth of a small load); from any
    other catalog, or when the lookup finds nothing (the full path then says which tables
    exist), the catalog's own table."""
    if catalog_properties(config) is None:
        location = _embedded_metadata_location(config, home, identifier)
        if location is not None:
            _say_unused_pyiceberg_configuration(config.name)
            return _static_table(identifier, location, embedded_catalog_properties(home))
    return load_table(open_catalog(config, home, create=False), identifier)


def _static_table(identifier: str, location: str, properties: dict[str, str]) -> Any:
    """The table whose metadata file is ``location``, its files read with the FileIO of the
    catalog's ``properties`` alone (``StaticTable.from_metadata`` would build it with the
    table's properties too: ``table_io_refusal``)."""
    from pyiceberg.catalog.noop import NoopCatalog
    from pyiceberg.io import load_file_io
    from pyiceberg.serializers import FromInputFile
    from pyiceberg.table import StaticTable

    from bulldozer.warehouse.file_io import checked_io

    io = checked_io(load_file_io(properties=properties, location=location))  # local files checked as opened
    with reading_metadata(f"table {identifier!r}"):
        metadata = FromInputFile.table_metadata(io.new_input(location))
    refused = table_io_refusal(identifier, metadata.properties)
    if refused:
        raise CatalogError(refused)
    return StaticTable(
        identifier=("static-table", location),
        metadata_location=location,
        metadata=metadata,
        io=io,
        catalog=NoopCatalog("static-table"),
    )
