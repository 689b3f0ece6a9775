"""Configuration of each storage engine: one pydantic model per engine, joined in a
discriminated union on ``type`` (no heavy imports here: drivers load lazily)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "DEFAULT_MAP_SIZE",
    "CassandraConfig",
    "EmbeddedConfig",
    "EngineConfig",
    "MemoryConfig",
    "RedisConfig",
    "address_space_limit",
    "default_map_size",
]

_MODEL = ConfigDict(frozen=True, extra="forbid")
_HOST_PORT = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+|[0-9A-Fa-f:]+(?<!:)))(?::(?P<port>[0-9]{1,5}))?"
)


class MemoryConfig(BaseModel):
    """In-process dictionaries; for tests."""

    model_config = _MODEL
    type: Literal["memory"] = "memory"


#: the most an embedded store may grow to, unless configured or fitted (``default_map_size``)
DEFAULT_MAP_SIZE = 64 * 1024**3


def address_space_limit() -> int | None:
    """This process's limit on its address space (``ulimit -v``), in bytes; None when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def default_map_size() -> int:
    """``DEFAULT_MAP_SIZE``, or a quarter of this process's address-space limit when one is
    set (``ulimit -v``, as batch schedulers and shared hosts set it): LMDB maps the whole size
    when it opens the store, and a map that did not fit failed every run on the embedded
    default with "Cannot allocate memory". The rest is left to the process (Arrow, gRPC,
    the native data plane)."""
    limit = address_space_limit()
    if limit is None:
        return DEFAULT_MAP_SIZE
    return max(1024**2, min(DEFAULT_MAP_SIZE, limit // 4 // 1024**2 * 1024**2))


class EmbeddedConfig(BaseModel):
    """LMDB on local disk: one sub-database per namespace."""

    model_config = _MODEL
    type: Literal["embedded"] = "embedded"
    path: str = Field(description="Directory of the store (created if missing).")
    map_size: int = Field(
        default_factory=default_map_size,
        ge=1024**2,
        description="Largest size the store may grow to (a sparse file; raise it when full). Default 64 GiB, "
        "or a quarter of the process's address-space limit (ulimit -v) when one is set.",
    )
    max_namespaces: int = Field(default=8192, ge=16, description="Namespaces one process may open.")
    writemap: bool = Field(
        default=False,
        description="Write pages in place in the memory map (about 1.8x faster random-key loads, measured when "
        "commits were not flushed). LMDB flushes each commit as without it, but the machine-crash test sees only "
        "writes through file descriptors, so a store written this way is not tested against a crash. Off by "
        "default.",
    )

    def kvd_arguments(self) -> list[str]:
        """How ``bulldozer-kvd`` opens this store: as the engine opens it (its data plane and
        its layer merges alike)."""
        return [
            f"--store={self.path}",
            f"--map-size={self.map_size}",
            f"--max-dbs={self.max_dbs}",
            f"--writemap={'true' if self.writemap else 'false'}",
        ]

    @property
    def max_dbs(self) -> int:
        """LMDB named databases a process opens at most: each namespace's data and (a layered
        version's) tombstones, and the metadata databases."""
        return 2 * self.max_namespaces + 8


_PREFIX = r"^[a-z][a-z0-9_]{0,47}$"
_WRITE_LEASE: float = Field(
    default=120.0,
    gt=0,
    description="How long a crashed writer can hold up a seal or drop (a live batch ends far sooner).",
)


class RedisConfig(BaseModel):
    """Redis 7, standalone or cluster: one hash per (namespace, bucket); metadata in one slot."""

    model_config = _MODEL
    type: Literal["redis"] = "redis"
    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis://[user:password@]host:port/db (rediss:// for TLS); in cluster mode, any one node.",
    )
    cluster: bool = Field(default=False, description="Talk Redis Cluster (slot routing, one script per slot).")
    prefix: str = Field(
        default="bulldozer",
        pattern=_PREFIX,
        description="Every key Bulldozer writes starts with this; a prefix holding foreign keys is refused.",
    )
    buckets: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="Hashes one version is spread over (fixed when the prefix is first used).",
    )
    timeout_seconds: float = Field(default=10.0, gt=0, description="Socket connect and read timeout.")
    max_connections: int = Field(default=64, ge=1, description="Connection pool size (standalone).")
    write_lease_seconds: float = _WRITE_LEASE

    @model_validator(mode="after")
    def _standalone_only(self) -> RedisConfig:
        """``max_connections`` sizes a standalone client's pool; given with ``cluster`` it was
        left unused without a word."""
        if self.cluster and "max_connections" in self.model_fields_set:
            raise ValueError("max_connections sizes a standalone Redis client's pool; a cluster client has none")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        """A URL redis-py takes (its scheme, port and options), checked without connecting:
        one it does not took the serve command down with a traceback. Its message never
        quotes the URL (a password may be in it)."""
        try:
            from redis import ConnectionPool
        except ImportError:
            return url  # the engine says what to install
        try:
            ConnectionPool.from_url(url)
        except ValueError as exc:
            from bulldozer.redaction import first_line

            raise ValueError(f"not a Redis URL: {first_line(exc)}") from None
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(url)
        db = unquote(parts.path).strip("/")
        if parts.scheme in ("redis", "rediss") and db and not db.isdigit():
            # redis-py takes such a path as database 0, without a word
            raise ValueError(f"not a Redis URL: its path names the database by number (/0, /1, ...), not {db!r}")
        return url


class CassandraConfig(BaseModel):
    """Apache Cassandra: one table per version in one keyspace; metadata changes are LWTs."""

    model_config = _MODEL
    type: Literal["cassandra"] = "cassandra"
    contact_points: list[str] = Field(
        default=["127.0.0.1"],
        min_length=1,
        description="Seed hosts of the cluster: host, host:port or [ipv6]:port (without a port: `port`).",
    )
    port: int = Field(default=9042, ge=1, le=65535, description="Native protocol port.")
    protocol_version: int = Field(default=5, ge=3, le=6, description="Native protocol version (5: Cassandra 4+).")
    keyspace: str = Field(default="bulldozer", pattern=_PREFIX, description="Keyspace Bulldozer owns.")
    replication: dict[str, str] = Field(
        default={"class": "SimpleStrategy", "replication_factor": "1"},
        description="Replication of the keyspace when Bulldozer creates it (use NetworkTopologyStrategy in "
        "production).",
    )
    local_dc: str | None = Field(default=None, description="Data center for DC-aware load balancing.")
    username: str | None = None
    password: SecretStr | None = None
    write_consistency: str = Field(default="LOCAL_QUORUM", description="Consistency of data writes.")
    read_consistency: str = Field(default="LOCAL_QUORUM", description="Consistency of reads and metadata.")
    serial_consistency: str = Field(default="LOCAL_SERIAL", description="Consistency of lightweight transactions.")
    concurrency: int = Field(default=128, ge=1, le=4096, description="Writes in flight per batch.")
    timeout_seconds: float = Field(default=20.0, gt=0, description="Request timeout.")
    connect_timeout_seconds: float = Field(default=10.0, gt=0, description="Connect timeout at start.")
    reconnect_max_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Longest pause between attempts to reach a node that went down: the DAL serves again at most "
        "this long after the node is back (the driver's own pauses grow to 10 minutes).",
    )
    write_lease_seconds: float = _WRITE_LEASE

    @field_validator("contact_points")
    @classmethod
    def _contact_points(cls, points: list[str]) -> list[str]:
        for point in points:
            split_host_port(point)
        return points

    @model_validator(mode="after")
    def _credentials(self) -> CassandraConfig:
        """A password is sent with its user name: one without was left unused without a word
        (the driver then connected without credentials)."""
        if self.password is not None and not self.username:
            raise ValueError("password without username: the driver sends credentials as a pair")
        return self

    def endpoints(self) -> list[str | tuple[str, int]]:
        """The contact points as the driver takes them: a host (on ``port``), or (host, port)."""
        out: list[str | tuple[str, int]] = []
        for point in self.contact_points:
            host, port = split_host_port(point)
            out.append(host if port is None else (host, port))
        return out


def split_host_port(point: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[ipv6]:port`` → (host, port or None); ValueError if malformed."""
    match = _HOST_PORT.fullmatch(point.strip())
    if match is None:
        raise ValueError(f"contact point {point!r} is not host, host:port or [ipv6]:port")
    host = match.group("v6") or match.group("host")
    port = match.group("port")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"contact point {point!r}: port {port} is out of range")
    return host, int(port) if port is not None else None


EngineConfig = Annotated[
    MemoryConfig | EmbeddedConfig | RedisConfig | CassandraConfig,
    Field(discriminator="type"),
]
