"""A job's generated schema: the model, the ``.proto`` text and the compiled descriptor."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from bulldozer.schema.compat import CompatReport, apply_reserved, check_compatibility
from bulldozer.schema.compile import CompiledSchema, compile_proto, load_message_classes
from bulldozer.schema.iceberg import generate_proto
from bulldozer.schema.model import ProtoFile
from bulldozer.schema.render import render_proto
from bulldozer.spec.models import JobSpec

__all__ = ["JobSchema", "build_job_schema", "proto_file_name"]


def proto_file_name(spec: JobSpec) -> str:
    return f"{spec.metadata.name}.proto"


@dataclass
class JobSchema:
    """Everything generated from one spec and one table schema."""

    proto: ProtoFile
    text: str
    compiled: CompiledSchema
    compat: CompatReport | None = field(default=None)

    @property
    def descriptor_set(self) -> bytes:
        return self.compiled.descriptor_set

    @property
    def key_full_name(self) -> str:
        return f"{self.proto.package}.{self.proto.key.name}"

    @property
    def value_full_name(self) -> str:
        return f"{self.proto.package}.{self.proto.value.name}"

    @cached_property
    def classes(self) -> tuple[Any, Any]:
        key, value = load_message_classes(self.descriptor_set, self.key_full_name, self.value_full_name)
        return key, value


def build_job_schema(
    spec: JobSpec,
    table_schema: Any,
    source: str = "",
    previous_descriptor_set: bytes | None = None,
    python: bool = True,
) -> JobSchema:
    """Generate, render and compile the job's schema. With a previous descriptor set,
    dropped value fields are reserved and the compatibility report is attached (the
    caller decides whether a breaking report stops it)."""
    proto = generate_proto(spec, table_schema, source)
    if previous_descriptor_set is not None:
        apply_reserved(proto, previous_descriptor_set)
    text = render_proto(proto)
    compiled = compile_proto(text, proto_file_name(spec), python=python)
    compat = (
        check_compatibility(previous_descriptor_set, compiled.descriptor_set)
        if previous_descriptor_set is not None
        else None
    )
    return JobSchema(proto, text, compiled, compat)
