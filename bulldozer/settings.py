"""The process's configuration from ``BULLDOZER_*`` environment variables, typed.

This module is the only one below the command line that reads the environment: every
``BULLDOZER_*`` variable is a field of :class:`Settings`, and the few other variables a
part needs (a spec's ``${VAR}``, a principal's ``token_env``, the cache root, a child
process's environment) are read through its functions. Commands resolve their options
with one precedence — a command-line flag, then the spec where one applies, then the
environment, then the default — and pass the result down as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from bulldozer.errors import InvalidArgumentError

__all__ = ["DEFAULT_HOME", "Settings", "cache_root", "child_environment", "environment", "load_settings"]

DEFAULT_HOME = ".bulldozer"


class Settings(BaseSettings):
    """``BULLDOZER_<FIELD>`` for each field (``BULLDOZER_ENDPOINT``, ``BULLDOZER_TOKEN``, …)."""

    model_config = SettingsConfigDict(env_prefix="BULLDOZER_", extra="ignore", frozen=True)

    #: Embedded state folder: catalog, warehouse, KV store, logs.
    home: Path | None = None
    #: The DAL commands act on when no flag (or spec) names one: ``embedded`` or ``host:port``.
    endpoint: str | None = None
    #: The operator's bearer token.
    token: SecretStr | None = None
    #: Endpoints besides ``endpoint`` that the operator's token may be sent to when a spec
    #: names them: comma-separated ``host:port``, as written in specs.
    token_endpoints: str = ""
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
    spark_driver_memory: str = "2g"
    #: The encoder: compiled kernels' cache folder, and which kernels (auto, layout, fields).
    kernel_cache: Path | None = None
    encoder_kernels: Literal["auto", "layout", "fields"] | None = None
    #: Fault injection for the tests of failure handling (see ``bulldozer.load.runner``).
    fault: str = ""
    #: The native data plane's binary (default: the one scripts/build_native.sh built).
    kvd: Path | None = None
    #: Which data plane ``serve`` uses: auto, native or python.
    data_plane: Literal["auto", "native", "python"] = "auto"
    #: Where downloaded tools (protoc plugins, Maven) are cached (default ``~/.cache/bulldozer``).
    cache: Path | None = None

    def specs_folder(self, home: str | os.PathLike[str] | None = None) -> Path:
        """The scheduler's specs folder: ``BULLDOZER_SPECS_DIR``, else ``<home>/specs``."""
        return self.specs_dir or self.home_path(home) / "specs"

    def home_path(self, flag: str | os.PathLike[str] | None = None) -> Path:
        """The state folder: ``flag``, else ``BULLDOZER_HOME``, else ``./.bulldozer`` (absolute)."""
        return Path(flag or self.home or DEFAULT_HOME).absolute()

    def dal_endpoint(self, flag: str | None = None) -> str:
        """The DAL a command without a spec acts on: ``flag``, else ``BULLDOZER_ENDPOINT``, else the
        embedded store."""
        return flag or self.endpoint or "embedded"

    def operator_token(self) -> str | None:
        return self.token.get_secret_value() if self.token else None

    def token_allowed_for(self, endpoint: str) -> bool:
        """May the operator's token go to ``endpoint`` when a spec (not the operator) names it?"""
        allowed = {e.strip() for e in self.token_endpoints.split(",") if e.strip()}
        if self.endpoint:
            allowed.add(self.endpoint.strip())
        return endpoint == "embedded" or endpoint in allowed

    def tls_files(self) -> tuple[Path | None, Path | None, Path | None] | None:
        """(CA, certificate, key) for client TLS, or None for plaintext."""
        if not (self.tls_ca or self.tls_cert):
            return None
        return self.tls_ca, self.tls_cert, self.tls_key


def load_settings() -> Settings:
    """The settings as the environment holds them now; a malformed variable is one clear
    error naming it (its value is not repeated: it may be a secret)."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"BULLDOZER_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}" for err in exc.errors()
        )
        raise InvalidArgumentError(f"invalid environment: {problems}") from None


def environment() -> Mapping[str, str]:
    """The process environment, for a spec's ``${VAR}`` and a principal's ``token_env``."""
    return os.environ


def cache_root() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def child_environment(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, with ``extra`` set."""
    return {**os.environ, **extra}
