"""The schema a version stores, as bytes: the ``FileDescriptorSet`` of its key and value
messages (with their imports), read into a private descriptor pool so that versions with
different schemas never clash.

The DAL reads it as a version is created (``rules.Rules.create_namespace``), so that no
version holds a schema its readers cannot load; every reader of a version's records
(``schema.compile.load_message_classes``: ``get``, ``scan``, the console, the shadow read)
loads it with the same function.
"""

from __future__ import annotations

from typing import Any

__all__ = ["descriptor_files", "message_descriptors"]


def descriptor_files(descriptor_set: bytes) -> list[Any]:
    """The ``FileDescriptorProto`` s ``descriptor_set`` holds; a ValueError when the bytes do
    not parse as a ``FileDescriptorSet``."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        return list(descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file)
    except DecodeError:
        raise ValueError("it does not parse as a protobuf FileDescriptorSet") from None


def message_descriptors(descriptor_set: bytes, *full_names: str) -> list[Any]:
    """The descriptors of the messages ``full_names`` (``package.Message``) in
    ``descriptor_set``; a ValueError saying what keeps them from loading: the bytes do not
    parse, a file in them does not build (an import missing, a type it names nowhere), or
    a message is not there."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for file_proto in descriptor_files(descriptor_set):
        try:
            pool.Add(file_proto)
        except Exception as exc:  # protobuf's backends raise TypeError or ValueError here
            raise ValueError(f"its file {file_proto.name!r} does not build: {' '.join(str(exc).split())}") from None
    found = []
    for name in full_names:
        try:
            found.append(pool.FindMessageTypeByName(name))
        except KeyError:
            raise ValueError(f"it has no message {name!r}") from None
    return found
