"""The specs folder the scheduler reads: submitting a spec into it, listing what is there.

The folder is ``$BULLDOZER_SPECS_DIR`` (default ``$BULLDOZER_HOME/specs``). A submitted
spec is stored as ``<metadata.name>.yaml``, written to a temporary file in the same folder
and renamed into place, so the scheduler never parses a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bulldozer.errors import BulldozerError, InvalidArgumentError, SpecError, SpecIssue
from bulldozer.redaction import first_line
from bulldozer.spec.loader import LoadedSpec, load_spec

__all__ = ["JobInfo", "find_specs", "list_jobs", "specs_folder", "submit"]

SUFFIXES = (".yaml", ".yml")


def specs_folder(home: str | os.PathLike[str] | None = None) -> Path:
    from bulldozer.settings import load_settings

    return load_settings().specs_folder(home)


def find_specs(folder: Path) -> list[Path]:
    """Spec files in the folder, by name (hidden and temporary files are skipped); none when
    it does not exist yet (nothing was submitted). Something else by its name is refused:
    ``jobs`` said no job was submitted, and the DAG loader made no DAG, without a word."""
    if not folder.exists():
        return []
    _check_folder(folder)
    return sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and not p.name.startswith("."))


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise InvalidArgumentError(
            f"the specs folder {folder} is not a folder (BULLDOZER_SPECS_DIR, else the home's specs/)"
        )


def submit(
    path: Path,
    home: str | None = None,
    folder: Path | None = None,
    check_catalog: bool = True,
    take_over: bool = False,
) -> Path:
    """Validate ``path`` (against its catalog too) and place it in the specs folder
    atomically as ``<name>.yaml``. Refuses a second job of the same name, or of the same alias,
    from another file; and, unless ``take_over``, replacing a submitted job of another owner
    (the same name from another team replaced its job without a word)."""
    from bulldozer.spec.checks import spec_issues

    loaded = load_spec(path)
    issues = spec_issues(loaded, check_catalog, home)
    if issues:
        raise SpecError(issues)
    folder = folder or specs_folder(home)
    if folder.exists():
        _check_folder(folder)  # mkdir said "File exists"
    folder.mkdir(parents=True, exist_ok=True)
    name = loaded.spec.metadata.name
    target = folder / f"{name}.yaml"
    alias = loaded.spec.alias
    for other in find_specs(folder):
        if other == target:
            owner = loaded.spec.metadata.owner
            try:
                submitted_owner = load_spec(other).spec.metadata.owner
            except BulldozerError:
                continue  # an invalid file of that name: nothing it runs to hand over
            if submitted_owner != owner and not take_over:
                raise SpecError(
                    [
                        SpecIssue(
                            str(path),
                            "metadata.owner",
                            f"the job {name!r} belongs to {submitted_owner!r} (submitted as {other}), not to "
                            f"{owner!r}: submitting it would replace their job (--take-over hands it over)",
                        )
                    ]
                )
            continue
        try:
            submitted = load_spec(other).spec
        except BulldozerError:
            continue
        if submitted.metadata.name == name:
            raise SpecError(
                [SpecIssue(str(path), "metadata.name", f"a job named {name!r} is already submitted as {other}")]
            )
        if submitted.alias == alias:  # two jobs would flip one alias to their own data in turn
            raise SpecError(
                [
                    SpecIssue(
                        str(path),
                        "key_value_dal.alias",
                        f"the alias {alias!r} is the job {submitted.metadata.name!r}'s (submitted as {other}): "
                        "name another alias",
                    )
                ]
            )
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(loaded.text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@dataclass
class JobInfo:
    name: str
    file: str
    alias: str = ""
    schedule: str | None = None
    #: the IANA zone the schedule's times are in
    timezone: str = "UTC"
    owner: str = ""
    current_version: str = ""
    last_run: dict[str, Any] | None = None
    error: str = ""
    #: the store the job's versions were read from (empty offline)
    store: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_jobs(folder: Path, home: str | None = None, with_state: bool = True) -> list[JobInfo]:
    """Every spec in the folder, with (``with_state``) the alias's current version and the last run."""
    jobs = []
    for path in find_specs(folder):
        try:
            loaded = load_spec(path)
        except BulldozerError as exc:
            jobs.append(JobInfo(name=path.stem, file=str(path), error=first_line(exc)[:300]))
            continue
        spec = loaded.spec
        info = JobInfo(
            name=spec.metadata.name,
            file=str(path),
            alias=spec.alias,
            schedule=spec.metadata.schedule,
            timezone=spec.metadata.timezone,
            owner=spec.metadata.owner,
        )
        if with_state:
            try:
                _fill_state(info, loaded, home)
            except BulldozerError as exc:
                info.error = first_line(exc)[:300]
        jobs.append(info)
    return jobs


def _fill_state(info: JobInfo, loaded: LoadedSpec, home: str | None) -> None:
    from bulldozer.kv.connect import connect_for_spec
    from bulldozer.versioning.flip import live_version
    from bulldozer.versioning.run_state import run_record_of

    with connect_for_spec(loaded, home, create=False) as client:
        info.store = client.store
        live = live_version(client, info.alias)
        info.current_version = live.name if live else ""
        versions, now = client.list_namespaces(info.alias), client.now()  # a stopped run is told on the DAL's clock
        runs = [(v, run) for v in versions if (run := run_record_of(v, now)) is not None]
        if runs:
            newest, run = runs[-1]
            info.last_run = {
                "version": newest.name,
                "state": newest.state.value,
                "outcome": run.outcome,
                "started": run.started,
                "finished": run.finished,
                "error": run.error or newest.failure_reason,
            }
