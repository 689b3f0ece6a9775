"""The README every generated client carries: how to install or build it, a one-line read,
and the runtime floors (written from ``templates/client_<lang>/README.md.tmpl``)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from bulldozer.schema.job import JobSchema

__all__ = ["example_key", "render_readme"]

_EXAMPLES: dict[str, Any] = {
    "bool": True,
    "int32": 1,
    "int64": 1,
    "float": 1.5,
    "double": 1.5,
    "string": "a",
    "decimal": "1.00",
    "date": 19000,
    "time": 0,
    "bytes": "AAAAAAAAAAAAAAAAAAAAAA==",
    "timestamp": "2024-01-01T00:00:00Z",
}


def example_key(job: JobSchema) -> str:
    """A key of the job as protobuf JSON (what the generated readers' command lines parse)."""
    return json.dumps({f.name: _EXAMPLES.get(f.scalar or "", "a") for f in job.proto.key.fields})


def render_readme(lang: str, schema: JobSchema, **values: Any) -> bytes:
    """The README of a ``lang`` client of the job whose schema is ``schema``."""
    text = (resources.files("bulldozer.codegen") / "templates" / f"client_{lang}" / "README.md.tmpl").read_text(
        encoding="utf-8"
    )
    key = example_key(schema)
    fields = ", ".join(f"{f.name}={_EXAMPLES.get(f.scalar or '', 'a')!r}" for f in schema.proto.key.fields)
    return text.format(key_json=key, key_json_shell=key.replace("'", "'\\''"), key_kwargs=fields, **values).encode()
