"""The operator's configuration files written in YAML (the DAL's auth configuration and
engine configuration, the profiles file, OpenLineage's configuration), read one way.

PyYAML's ``safe_load`` keeps the last of a key given twice in one mapping and says nothing:
a principal listed twice in an auth configuration lost its first permissions without a
word. Here a repeated key is a ``yaml.MarkedYAMLError`` pointing at its second place, which
every reader already reports as ``PATH:LINE:COLUMN: ...`` (``redaction.yaml_where``).
(A job spec has a reader of its own, ``bulldozer.spec.loader``, which refuses the same.)
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["load_yaml"]


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing a key repeated in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: construct_mapping says so itself
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"the key {key!r} is given twice", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, except that a key given twice in one mapping is a
    ``yaml.constructor.ConstructorError`` at its second place."""
    return yaml.load(text, Loader=_Loader)
