"""Iceberg → protobuf: generation, rendering, compatibility checks and compilation."""

from bulldozer.schema.compile import CompiledSchema, compile_proto, load_message_classes
from bulldozer.schema.iceberg import generate_proto, select_columns
from bulldozer.schema.model import ProtoField, ProtoFile, ProtoMessage
from bulldozer.schema.render import render_proto

__all__ = [
    "CompiledSchema",
    "ProtoField",
    "ProtoFile",
    "ProtoMessage",
    "compile_proto",
    "generate_proto",
    "load_message_classes",
    "render_proto",
    "select_columns",
]
