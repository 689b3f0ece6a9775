"""What operators and users write as YAML or JSON (the DAL's auth configuration and engine
configuration, the profiles file, OpenLineage's configuration, ``BULLDOZER_CATALOGS``, a
key given to ``get --key``), read one way: a key given twice in one mapping is refused.

PyYAML's ``safe_load`` and ``json.loads`` keep the last of a key given twice and say
nothing: a principal listed twice in an auth configuration lost its first permissions, and
a catalog named twice in ``BULLDOZER_CATALOGS`` its first properties, without a word. Here a
repeated YAML key is a ``yaml.MarkedYAMLError`` pointing at its second place, which every
reader already reports as ``PATH:LINE:COLUMN: ...`` (``redaction.yaml_where``), and a
repeated JSON key is a ``RepeatedKey``. (A job spec has a reader of its own,
``bulldozer.spec.loader``, which refuses the same.) PyYAML is imported when YAML is read.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

__all__ = ["RepeatedKey", "load_json", "load_yaml"]


class RepeatedKey(ValueError):
    """A key given twice in one JSON object (``key``: which)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} is given twice")
        self.key = key


def load_json(text: str) -> Any:
    """``json.loads`` of ``text``, except that a key given twice in one object is a
    ``RepeatedKey`` (``json.JSONDecodeError`` for text that is not JSON, as before)."""
    import json

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise RepeatedKey(key)
            found[key] = value
        return found

    return json.loads(text, object_pairs_hook=unique)


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    import yaml

    class Loader(yaml.SafeLoader):
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
                        "while reading a mapping",
                        node.start_mark,
                        f"the key {key!r} is given twice",
                        key_node.start_mark,
                    )
            return super().construct_mapping(node, deep=deep)

    return Loader


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, except that a key given twice in one mapping is a
    ``yaml.constructor.ConstructorError`` at its second place."""
    import yaml

    return yaml.load(text, Loader=_loader())
