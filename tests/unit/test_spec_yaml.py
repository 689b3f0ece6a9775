"""A spec's YAML is read by libyaml where PyYAML has it, and by PyYAML's own parser whenever
libyaml finds anything off (``bulldozer.spec.loader._fast_node``): both give every spec of
the corpus the same result, its issues and their positions included, and every good spec
takes the fast path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bulldozer.errors import SpecError
from bulldozer.spec import loader
from bulldozer.spec.loader import MAX_DEPTH, load_spec_text
from tests.conftest import SPECS

SPECS_ALL = sorted(SPECS.glob("*/*.yaml"))
GOOD = sorted((SPECS / "good").glob("*.yaml"))
ENV = {"REGION": "eu", "TEAM": "ranking"}  # what a spec's ${VAR} may read here


def _outcome(text: str) -> object:
    """What loading the text gives: the spec and its positions, or the issues."""
    try:
        loaded = load_spec_text(text, "spec.yaml", ENV)
    except SpecError as exc:
        return [str(issue) for issue in exc.issues]
    return loaded.spec.model_dump(), loaded.positions.marks, loaded.expanded


@pytest.mark.parametrize("path", SPECS_ALL, ids=[f"{p.parent.name}/{p.stem}" for p in SPECS_ALL])
def test_libyaml_and_pyyaml_read_every_spec_alike(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    fast = _outcome(text)
    monkeypatch.setattr(loader, "_C_LOADER", None)
    assert _outcome(text) == fast


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_a_good_spec_is_read_by_libyaml(path: Path) -> None:
    assert loader._C_LOADER is not None, "PyYAML without libyaml: every spec is read by the slow parser"
    assert isinstance(loader._fast_node(path.read_text(encoding="utf-8")), yaml.MappingNode)


@pytest.mark.parametrize(
    "text",
    [
        "a: [1, 2\n",  # a syntax error
        "a: 1\n---\nb: 2\n",  # two documents
        "a: \x07\n",  # a character YAML does not allow
        "a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n",  # deeper than allowed
        "",
        "- a\n",  # not a mapping: left to the slow parser's words too
    ],
    ids=["syntax", "two-documents", "control-character", "too-deep", "empty", "sequence"],
)
def test_anything_off_is_left_to_pyyaml_to_describe(text: str) -> None:
    node = loader._fast_node(text)
    assert node is None or not isinstance(node, yaml.MappingNode)
    with pytest.raises(SpecError):
        load_spec_text(text, "spec.yaml", ENV)
