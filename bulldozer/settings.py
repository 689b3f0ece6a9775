"""The process's configuration from ``BULLDOZER_*`` environment variables, typed.

This module is the only one below the command line that reads the environment: every
``BULLDOZER_*`` variable is a field of :class:`Settings`, and the few other variables a
part needs (a spec's ``${VAR}``, a principal's ``token_env``, the cache root, a child
process's environment) are read through its functions. Commands resolve their options
with one precedence — a command-line flag, then the spec where one applies, then the
variable, then the selected profile (see :class:`ProfilesFile`), then the default — and
pass the result down as arguments.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ByteSize, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bulldozer.errors import InvalidArgumentError
from bulldozer.names import closest, did_you_mean
from bulldozer.redaction import first_line, yaml_problem, yaml_where

__all__ = [
    "DEFAULT_HOME",
    "GRPC_PROXY_VARIABLES",
    "Profile",
    "ProfilesFile",
    "Settings",
    "cache_root",
    "child_environment",
    "environment",
    "grpc_proxy",
    "java_executable",
    "load_settings",
    "pyspark_python",
    "python_command",
    "select_profile",
    "spec_environment",
]

DEFAULT_HOME = ".bulldozer"
#: a size DuckDB reads: ``512MiB``, ``4GB``, ``25%`` (of RAM, for memory)
_SIZE = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B|B|bytes|%)?\s*$"


def _listed(value: str) -> list[str]:
    """The names of a comma-separated setting (``a:1, b:2``), blanks left out."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _roots(value: str) -> str:
    """``data_file_roots``: each ``*``, an absolute path or a URI with its scheme. A root
    without either (``lake/legacy``, a forgotten ``s3://``) was read as a local path from
    ``/``, allowing what no one meant and not what was."""
    for root in _listed(value):
        if root != "*" and not root.startswith("/") and "://" not in root:
            raise ValueError(f"{root!r} is neither an absolute path nor a URI with its scheme (s3://bucket/prefix)")
    return value


_ENDPOINT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\],]+):[0-9]{1,5}")
_ENDPOINT_PATTERN = re.compile(r"\*|(\[[0-9A-Fa-f:.*?]+\]|[^\s:\[\],]+):([0-9]{1,5}|\*)")
_VARIABLE_PATTERN = re.compile(r"[A-Za-z_*?][A-Za-z0-9_*?]*")


def _endpoints(value: str) -> str:
    """``token_endpoints``: each ``host:port``, as a spec writes it. Another entry (no port,
    a stray bracket) matched no endpoint, so the operator's intent was lost without a word."""
    for entry in _listed(value):
        if not _ENDPOINT.fullmatch(entry):
            raise ValueError(f"{entry!r} is not host:port (e.g. dal.example.com:7110)")
    return value


def _endpoint_patterns(value: str) -> str:
    """``spec_endpoints``: each ``*``, or ``host:port`` with ``*`` / ``?`` wildcards."""
    for entry in _listed(value):
        if not _ENDPOINT_PATTERN.fullmatch(entry):
            raise ValueError(f"{entry!r} is not host:port or a pattern of them (e.g. *.dal.example.com:7110, or *)")
    return value


def _variable_patterns(value: str) -> str:
    """``spec_variables``: each a variable's name or a pattern of names (``DAL_*``)."""
    for entry in _listed(value):
        if not _VARIABLE_PATTERN.fullmatch(entry):
            raise ValueError(f"{entry!r} is not a variable name or a pattern of names (e.g. DAL_HOST, DAL_*)")
    return value


def _json_object(value: object) -> object:
    """``catalogs`` from ``BULLDOZER_CATALOGS``: its JSON, a key given twice in one object
    refused at the second (JSON keeps the last, so a catalog named twice lost its first
    properties, and a property given twice its first value, without a word). A value that
    is not text (a profile's, the default) is validated as it is. The message names keys,
    never values: a catalog's properties may hold a credential."""
    if not isinstance(value, str):
        return value
    import json

    from bulldozer.config_files import load_json

    try:
        return load_json(value)  # a key given twice: RepeatedKey, a ValueError naming the key
    except json.JSONDecodeError:
        raise ValueError("not valid JSON") from None


def _time_limit(value: object) -> timedelta | None:
    """``run_timeout``: a time limit as a spec writes one (``2h``, ``45m``, seconds)."""
    from bulldozer.spec.models import parse_time_limit  # when set: the spec models are not a light import

    return None if value is None else parse_time_limit(value)


class Settings(BaseSettings):
    """``BULLDOZER_<FIELD>`` for each field (``BULLDOZER_ENDPOINT``, ``BULLDOZER_TOKEN``, …)."""

    model_config = SettingsConfigDict(env_prefix="BULLDOZER_", extra="ignore", frozen=True, env_ignore_empty=True)

    #: Embedded state folder: catalog, warehouse, KV store, logs.
    home: Path | None = None
    #: The DAL commands act on when no flag (or spec) names one: ``embedded`` or ``host:port``.
    endpoint: str | None = None
    #: The operator's bearer token.
    token: SecretStr | None = None
    #: Endpoints besides ``endpoint`` that the operator's token may be sent to when a spec
    #: names them: comma-separated ``host:port``, as written in specs.
    token_endpoints: Annotated[str, AfterValidator(_endpoints)] = ""
    #: Client TLS: the CA of the DAL's certificate, and for mutual TLS the client's own.
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: The specs folder the scheduler builds DAGs from (default ``<home>/specs``).
    specs_dir: Path | None = None
    #: The load engine of scheduled runs.
    load_engine: str = "local"
    #: The DAG loader raises on the first bad spec instead of making an invalid DAG of it.
    dags_strict: bool = False
    #: Spark: the master (``local[*]``, ``spark://host:7077``) and the driver's memory.
    spark_master: str = "local[*]"
    #: a JVM heap size (``2g``, ``512m``, ``1024k``; spark-submit hands it to ``-Xmx``): another made the
    #: driver's JVM exit at start, which said only "A fatal exception has occurred"
    spark_driver_memory: Annotated[str, Field(pattern=r"^[0-9]+[kKmMgGtT]?$")] = "2g"
    #: The address the Spark driver binds and tells executors (loopback: local mode and a
    #: cluster on this machine; a cluster elsewhere needs an address it can reach).
    spark_driver_host: str = "127.0.0.1"
    #: The executors' Python environment (``bulldozer spark package``), shipped with every
    #: Spark job (``spark.archives``); None: executors use the Python this one runs.
    spark_archive: Path | None = None
    #: Seconds a Spark write may go without any task running (no executor took it: the
    #: cluster has no free cores, or its executors cannot reach this driver) before the run
    #: fails instead of waiting for ever.
    spark_idle_timeout: Annotated[float, Field(gt=0)] = 300.0
    #: The native data plane's binary (default: the one scripts/build_native.sh built).
    kvd: Path | None = None
    #: ``bulldozer run`` hands itself over to the home's warm loader when one runs (``auto``),
    #: or always runs in its own process (``off``); see bulldozer.cli.loader.
    loader: Literal["auto", "off"] = "auto"
    #: Which data plane ``serve`` uses: auto, native or python.
    data_plane: Literal["auto", "native", "python"] = "auto"
    #: Where downloaded tools (protoc plugins, Maven) are cached (default ``~/.cache/bulldozer``).
    cache: Path | None = None
    #: Seconds a catalog may take to answer one call (opening it, loading a table) before the
    #: command fails instead of waiting for ever: pyiceberg's REST catalog asks with no timeout.
    catalog_timeout: Annotated[float, Field(gt=0)] = 60.0
    #: The operator's Iceberg catalogs, by the name specs give as ``data_movement.catalog.name``:
    #: each a mapping of pyiceberg catalog properties (``BULLDOZER_CATALOGS`` as JSON, e.g.
    #: ``{"warehouse": {"type": "rest", "uri": "https://iceberg.example.com"}}``); a profile's
    #: ``catalogs`` add the names this one lacks. A name no one configured is the embedded catalog.
    catalogs: Annotated[dict[str, dict[str, str]], NoDecode, BeforeValidator(_json_object)] = Field(
        default_factory=dict
    )
    #: Whether a spec may define a catalog itself (``data_movement.catalog.properties``):
    #: ``refuse`` (default) or ``allow``, for a deployment whose every spec author is trusted
    #: with what pyiceberg can reach (see ``bulldozer.warehouse.catalog.catalog_properties``).
    spec_catalogs: Literal["refuse", "allow"] = "refuse"
    #: The environment variables a spec's ``${VAR}`` may read: comma-separated names or
    #: patterns (``DAL_*``); none by default (``spec_environment``).
    spec_variables: Annotated[str, AfterValidator(_variable_patterns)] = ""
    #: The DALs a spec may name as ``key_value_dal.endpoint`` besides ``embedded``, ``endpoint``
    #: and ``token_endpoints``: comma-separated ``host:port`` or patterns
    #: (``*.dal.example.com:7110``); ``*`` lets a spec name any (``spec_may_name``).
    spec_endpoints: Annotated[str, AfterValidator(_endpoint_patterns)] = ""
    #: What a spec's query (DuckDB) may use: memory (DuckDB's ``memory_limit``; default
    #: DuckDB's own, 80 % of RAM) and disk to spill to (``max_temp_directory_size``), which
    #: it does only in a private scratch folder of the run (``bulldozer.load.source``).
    query_memory: Annotated[str, Field(pattern=_SIZE)] | None = None
    query_spill: Annotated[str, Field(pattern=_SIZE)] = "10GiB"
    #: What a spec's query may write into its version: keys and values, in bytes (``50GiB``);
    #: unset, no bound. A query can make rows from nothing (``range``, ``generate_series``, a
    #: cross join), so without it one spec's version can grow until the shared store is full;
    #: a query past it fails its run in one line (``bulldozer.load.engines.local``).
    query_output: ByteSize | None = None
    #: The longest a run may take (``2h``, ``45m``, seconds): past it the run is stopped and its
    #: version marked FAILED; under the scheduler, the longest each stage may take. A spec may
    #: ask for less (``metadata.timeout``), never more; unset, no limit but the spec's
    #: (``bulldozer.spec.policy.time_limit``).
    run_timeout: Annotated[timedelta | None, BeforeValidator(_time_limit)] = None
    #: Where a table's data and delete files may live besides under the table's location:
    #: comma-separated URI prefixes (``s3://lake/legacy/``, ``/mnt/hive``), or ``*`` for
    #: anywhere; none by default (``bulldozer.warehouse.files``).
    data_file_roots: Annotated[str, AfterValidator(_roots)] = ""
    #: The named profile to use (``--profile`` overrides), and the file that holds the profiles
    #: (default ``$XDG_CONFIG_HOME/bulldozer/profiles.yaml``, i.e. ``~/.config/bulldozer/…``).
    profile: str | None = None
    profiles_file: Path | None = None

    def specs_folder(self, home: str | os.PathLike[str] | None = None) -> Path:
        """The scheduler's specs folder: ``BULLDOZER_SPECS_DIR``, else ``<home>/specs``."""
        return self.specs_dir or self.home_path(home) / "specs"

    def home_path(self, flag: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Path:
        """The state folder: ``flag``, else ``BULLDOZER_HOME``, else ``./.bulldozer``; absolute
        (a relative one taken from ``cwd``, else from this process's working directory)."""
        path = Path(flag or self.home or DEFAULT_HOME)
        return cwd / path if cwd is not None and not path.is_absolute() else path.absolute()

    def cache_folder(self) -> Path:
        """Bulldozer's cache: ``BULLDOZER_CACHE``, else ``~/.cache/bulldozer`` (``cache_root``)."""
        return self.cache or cache_root() / "bulldozer"

    def dal_endpoint(self, flag: str | None = None) -> str:
        """The DAL a command without a spec acts on: ``flag``, else ``BULLDOZER_ENDPOINT``, else the
        embedded store."""
        return flag or self.endpoint or "embedded"

    def operator_token(self) -> str | None:
        return self.token.get_secret_value() if self.token else None

    def token_allowed_for(self, endpoint: str) -> bool:
        """May the operator's token go to ``endpoint`` when a spec (not the operator) names it?"""
        allowed = set(_listed(self.token_endpoints))
        if self.endpoint:
            allowed.add(self.endpoint.strip())
        return endpoint == "embedded" or endpoint in allowed

    def spec_may_name(self, endpoint: str) -> bool:
        """May a spec (not the operator) send a job's data to ``endpoint``? Only to a DAL the
        operator configured: the embedded store, ``endpoint``, ``token_endpoints``, or one
        ``spec_endpoints`` lists (``*`` for any)."""
        from fnmatch import fnmatchcase

        if endpoint == "embedded" or self.token_allowed_for(endpoint):
            return True
        return any(fnmatchcase(endpoint, p) for p in _listed(self.spec_endpoints))

    def data_file_roots_listed(self) -> list[str]:
        """``data_file_roots`` as a list."""
        return _listed(self.data_file_roots)

    def tls_files(self) -> tuple[Path | None, Path | None, Path | None] | None:
        """(CA, certificate, key) for client TLS, or None for plaintext."""
        if not (self.tls_ca or self.tls_cert):
            return None
        return self.tls_ca, self.tls_cert, self.tls_key


class Profile(BaseModel):
    """One named profile: where a set of commands acts, in the style of kubectl's contexts.
    A variable set in the environment wins over the profile's value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str | None = None
    home: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: Where the profile's bearer token is: an environment variable's name, or a file.
    token_env: str | None = None
    token_file: Path | None = None
    #: Iceberg catalogs by name (as ``BULLDOZER_CATALOGS``; a name the variable also has is its).
    catalogs: dict[str, dict[str, str]] = Field(default_factory=dict)


class ProfilesFile(BaseModel):
    """``profiles.yaml``: ``current`` (the profile used when none is selected) and ``profiles``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    current: str | None = None
    profiles: dict[str, Profile] = Field(default_factory=dict)


_selected: str | None = None


def select_profile(name: str | None) -> None:
    """The profile the command line's ``--profile`` names (it wins over ``BULLDOZER_PROFILE``)."""
    global _selected
    _selected = name


def _profiles_file(settings: Settings) -> Path:
    if settings.profiles_file:
        return settings.profiles_file
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "bulldozer" / "profiles.yaml"


#: path -> (mtime_ns, size, parsed): a command reads its settings in several places, the
#: file is parsed once while it stays the same
_parsed: dict[Path, tuple[int, int, ProfilesFile]] = {}


def _read_profiles(path: Path) -> ProfilesFile:
    import yaml

    from bulldozer.config_files import load_yaml

    try:
        if not path.is_file():
            return ProfilesFile()
        stat = path.stat()
        cached = _parsed.get(path)
        if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        parsed = ProfilesFile.model_validate(load_yaml(path.read_text(encoding="utf-8")) or {})
        _parsed[path] = (stat.st_mtime_ns, stat.st_size, parsed)
        return parsed
    except yaml.MarkedYAMLError as exc:
        raise InvalidArgumentError(f"{yaml_where(path, exc)}: not a valid profiles file: {yaml_problem(exc)}") from None
    except ValidationError as exc:
        problems = "; ".join(_profiles_problem(err) for err in exc.errors())
        raise InvalidArgumentError(f"{path}: not a valid profiles file: {problems}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgumentError(f"{path}: not a valid profiles file: {first_line(exc)}") from None


def _profiles_problem(err: Any) -> str:
    """One problem of a profiles file: where, and what, never the value (it may be a token)."""
    loc = [str(p) for p in err["loc"]]
    if not loc:
        return "it must be a mapping of 'current' and 'profiles'"
    where = ".".join(loc)
    if err["type"] != "extra_forbidden":
        return f"{where}: {err['msg']}"
    if loc[-1] == "token" and len(loc) == 3:
        return f"{where}: unknown field; a profile says where its token is: token_env (a variable) or token_file"
    model = Profile if loc[0] == "profiles" and len(loc) == 3 else ProfilesFile
    known = list(model.model_fields)
    hint = did_you_mean(loc[-1], known) or f"known: {', '.join(known)}"
    return f"{where}: unknown field; {hint}"


def _with_profile(settings: Settings) -> Settings:
    """``settings`` with the selected profile's values where no variable set them."""
    path = _profiles_file(settings)
    profiles = _read_profiles(path)
    name = _selected or settings.profile or profiles.current
    if not name:
        return settings
    profile = profiles.profiles.get(name)
    if profile is None:
        known = ", ".join(sorted(profiles.profiles)) or "none"
        raise InvalidArgumentError(f"profile {name!r} is not in {path} (profiles there: {known})")
    update: dict[str, object] = {
        field: getattr(profile, field)
        for field in ("endpoint", "home", "tls_ca", "tls_cert", "tls_key")
        if getattr(settings, field) is None and getattr(profile, field) is not None
    }
    if settings.token is None and (profile.token_env or profile.token_file):
        update["token"] = SecretStr(_profile_token(name, profile))
    if profile.catalogs:
        update["catalogs"] = {**profile.catalogs, **settings.catalogs}
    return settings.model_copy(update=update)


def _profile_token(name: str, profile: Profile) -> str:
    if profile.token_env:
        value = os.environ.get(profile.token_env)
        if not value:
            raise InvalidArgumentError(f"profile {name!r}: environment variable {profile.token_env} is not set")
        return value
    assert profile.token_file is not None
    try:
        return profile.token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidArgumentError(f"profile {name!r}: cannot read its token file: {exc.strerror}") from None


#: Variables earlier releases read and this one does not: set, they are refused (one line
#: saying why) rather than silently ignored.
RETIRED = {
    "BULLDOZER_KERNEL_CACHE": "the encoder's kernels are compiled when Bulldozer is installed; nothing is cached",
    "BULLDOZER_ENCODER_KERNELS": "the encoder has one compiled path, built when Bulldozer is installed",
    "BULLDOZER_FAULT": "fault injection is the tests' own: python -m tests.faults",
}


#: ``BULLDOZER_*`` variables that are no setting of Bulldozer's: the project's own scripts',
#: benchmarks' and tests' (and every ``BULLDOZER_TEST_*``). Any other that no field of
#: Settings reads is refused (a misspelt ``BULLDOZER_ENDPOINT`` ran against the embedded
#: store without a word); ``tests/unit/test_settings.py`` checks the list against the repo.
NOT_SETTINGS = {
    "BULLDOZER_PYTHON": "bench/run",
    "BULLDOZER_EXTRAS": "scripts/bootstrap.sh",
    "BULLDOZER_SAMPLE_ROWS": "scripts/quickstart.sh",
    "BULLDOZER_FEAST_VENV": "bench/feast_env.py",
    "BULLDOZER_UPDATE_GOLDENS": "the tests",
    "BULLDOZER_FAULT_REPEATS": "the tests",
    "BULLDOZER_HYPOTHESIS_EXAMPLES": "the tests",
}
_TESTS_OWN = "BULLDOZER_TEST_"


def _unknown(variables: tuple[tuple[str, str], ...]) -> None:
    """Refuse a set ``BULLDOZER_*`` variable that nothing reads, naming the setting it may
    have meant to be (its value is not repeated: it may be a secret)."""
    fields = [field.upper() for field in Settings.model_fields]
    known = {f"BULLDOZER_{field}" for field in fields} | set(RETIRED) | set(NOT_SETTINGS)
    for name, value in variables:
        upper = name.upper()
        if value and upper not in known and not upper.startswith(_TESTS_OWN):
            close = closest(upper.removeprefix("BULLDOZER_"), fields, cutoff=0.75)
            hint = f" (did you mean BULLDOZER_{close}?)" if close else ""
            raise InvalidArgumentError(f"{name} is not a setting Bulldozer reads{hint}; unset it")


#: the ``BULLDOZER_*`` variables the last ``Settings`` was made from, and it: a run reads its
#: settings in nine places, and pydantic-settings took ≈ 1.2 ms each time to make the same
#: object again (Settings is frozen: one can be shared)
_last: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def _from_environment() -> Settings:
    global _last
    variables = tuple(sorted((k, v) for k, v in os.environ.items() if k[:10].upper() == "BULLDOZER_"))
    if _last is None or _last[0] != variables:
        _unknown(variables)
        _last = (variables, Settings())
    return _last[1]


def load_settings() -> Settings:
    """The settings as the environment holds them now, completed by the selected profile; a
    malformed variable is one clear error naming it (its value is not repeated: it may be a
    secret), and so is a retired one (``RETIRED``)."""
    retired = [name for name in RETIRED if os.environ.get(name)]
    if retired:
        raise InvalidArgumentError(f"{retired[0]} is no longer read ({RETIRED[retired[0]]}); unset it")
    try:
        return _with_profile(_from_environment())
    except ValidationError as exc:
        problems = "; ".join(
            f"BULLDOZER_{'_'.join(str(p) for p in err['loc'][:1]).upper()}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise InvalidArgumentError(f"invalid environment: {problems}") from None


def environment() -> Mapping[str, str]:
    """The process environment, for a principal's ``token_env`` and lineage's settings."""
    return os.environ


class SpecEnvironment(dict[str, str]):
    """The variables a spec's ``${VAR}`` reads, and the names of those set but withheld."""

    def __init__(self, exposed: Mapping[str, str], withheld: frozenset[str]) -> None:
        super().__init__(exposed)
        self.withheld = withheld


def spec_environment() -> SpecEnvironment:
    """The environment a spec's ``${VAR}`` reads: only the variables the operator exposes to
    specs (``BULLDOZER_SPEC_VARIABLES``). A spec is untrusted input, and ``${VAR}`` may
    stand anywhere in the fields it expands in: with the whole environment, a spec could
    spell a secret into the host name it connects to (``${BULLDOZER_TOKEN}.example.com:443``)
    and hand it to whoever answers that name's DNS query."""
    from fnmatch import fnmatchcase

    patterns = _listed(load_settings().spec_variables)
    exposed = {k: v for k, v in os.environ.items() if any(fnmatchcase(k, p) for p in patterns)}
    return SpecEnvironment(exposed, frozenset(os.environ) - frozenset(exposed))


def cache_root() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def java_executable() -> Path | None:
    """The ``java`` Spark's driver starts: ``$JAVA_HOME/bin/java`` (as Spark's launcher
    picks it), else the one on ``PATH``; None when neither exists."""
    import shutil

    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    return Path(java) if java is not None and Path(java).exists() else None


def spark_class_path_folders(spark_home: Path) -> list[tuple[str, Path]]:
    """The folders Spark's launcher puts on its driver JVM's class path besides the jars, each
    with the variable that names it: the configuration folder (``SPARK_CONF_DIR``, else
    ``conf`` in the Spark home: ``SPARK_HOME`` when set, as pyspark's launcher takes it, else
    ``spark_home``), ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR`` and the entries of
    ``SPARK_DIST_CLASSPATH`` (Spark's ``AbstractCommandBuilder.buildClassPath``)."""
    home = Path(os.environ.get("SPARK_HOME") or spark_home)
    conf = os.environ.get("SPARK_CONF_DIR")
    folders = [("SPARK_CONF_DIR" if conf else "SPARK_HOME/conf", Path(conf) if conf else home / "conf")]
    folders += [(name, Path(os.environ[name])) for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR") if os.environ.get(name)]
    dist = os.environ.get("SPARK_DIST_CLASSPATH", "")
    folders += [("SPARK_DIST_CLASSPATH", Path(entry)) for entry in dist.split(os.pathsep) if entry and "*" not in entry]
    return folders


def spark_properties_files(spark_home: Path) -> list[Path]:
    """The properties files spark-submit reads the driver's defaults from, a later one's
    settings winning: ``spark-defaults.conf`` in the configuration folder
    (``spark_class_path_folders``' first), and the ``--properties-file`` that
    ``PYSPARK_SUBMIT_ARGS`` (which pyspark starts spark-submit with) names, which replaces
    it unless ``--load-spark-defaults`` is given too (Spark's ``SparkSubmitArguments``)."""
    import shlex

    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    named = [
        arg.partition("=")[2] if arg.startswith("--properties-file=") else args[at + 1]
        for at, arg in enumerate(args)
        if arg.startswith("--properties-file=") or (arg == "--properties-file" and at + 1 < len(args))
    ]
    (_, conf), *_ = spark_class_path_folders(spark_home)
    defaults = [conf / "spark-defaults.conf"] if not named or "--load-spark-defaults" in args else []
    return defaults + [Path(file) for file in named[-1:]]


#: The variables gRPC's C core takes its HTTP proxy from, the first one set winning
GRPC_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")


def grpc_proxy() -> tuple[str, str] | None:
    """The variable gRPC's channels take an HTTP proxy from, and its value, or None. gRPC
    sends a channel to any host through it unless ``no_grpc_proxy`` / ``no_proxy`` lists
    the host (``bulldozer.kv._transports`` keeps loopback's channels off it)."""
    for name in GRPC_PROXY_VARIABLES:
        if os.environ.get(name):
            return name, os.environ[name]
    return None


def pyspark_python() -> None:
    """Have pyspark start its Python workers with this interpreter (Bulldozer is installed
    beside it), unless the environment chose one. pyspark reads the worker's interpreter
    from ``PYSPARK_PYTHON`` only (``SparkContext.pythonExec``; the ``spark.pyspark.python``
    property is for spark-submit): this is the one variable written for a library below
    the CLI, and it is written here."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def python_command(*args: str) -> list[str]:
    """``python -P ARGS`` with this interpreter: a child Python that puts neither its working
    directory (``-m``) nor that of a ``-c`` script first on ``sys.path``. A command runs
    wherever it is started — a checkout of a repository of specs, say — and the DAL it
    started with ``-m`` imported an ``lmdb.py`` (``grpc.py``, ``yaml.py``, ...) found there
    instead of the installed module."""
    return [sys.executable, "-P", *args]


def child_environment(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, with ``extra`` set."""
    return {**os.environ, **extra}
