"""scripts/gen_constraints.py: constraints.txt pins what pyproject.toml requires, within its
ranges, and the test environment holds the pinned releases; --check says what disagrees."""

from __future__ import annotations

import re
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_constraints


@pytest.fixture(scope="module")
def pins() -> dict[NormalizedName, Version]:
    return gen_constraints.read_pins(gen_constraints.CONSTRAINTS.read_text())


@pytest.fixture(scope="module")
def installed() -> dict[NormalizedName, str]:
    return gen_constraints.installed_dependencies()


def test_the_pins_agree_with_pyproject_and_the_test_environment(
    pins: dict[NormalizedName, Version], installed: dict[NormalizedName, str]
) -> None:
    assert gen_constraints.problems(pins, installed) == []
    # the walk reached the project's dependencies, its extras' too
    assert {"grpcio", "pyiceberg", "pyspark", "apache-airflow", "pytest"} <= set(installed)
    # and the build's and pip are pinned, though not the project's dependencies
    assert {"setuptools-rust", "setuptools", "pip"} <= set(pins)


def test_a_pin_pyproject_refuses_is_reported(
    pins: dict[NormalizedName, Version], installed: dict[NormalizedName, str]
) -> None:
    grpcio = canonicalize_name("grpcio")
    said = gen_constraints.problems({**pins, grpcio: Version("1.66.0")}, {**installed, grpcio: "1.66.0"})
    assert said[0] == "constraints.txt pins grpcio==1.66.0, which pyproject.toml's grpcio<2,>=1.85.1 refuses"
    assert said[-1].startswith("refresh the pins with python scripts/gen_constraints.py")
    assert len(said) == 2


def test_a_requirement_not_pinned_is_reported(
    pins: dict[NormalizedName, Version], installed: dict[NormalizedName, str]
) -> None:
    fewer = {name: version for name, version in pins.items() if name != "setuptools-rust"}
    said = gen_constraints.problems(fewer, installed)
    assert said[:-1] == [
        "constraints.txt does not pin setuptools-rust (pyproject.toml requires setuptools-rust<2,>=1.10)"
    ]


def test_an_installed_release_other_than_its_pin_or_unpinned_is_reported(
    pins: dict[NormalizedName, Version], installed: dict[NormalizedName, str]
) -> None:
    newer = {**installed, canonicalize_name("cachetools"): "999.0", canonicalize_name("left-behind"): "1.0"}
    said = gen_constraints.problems(pins, newer)
    assert said[:-1] == [
        f"cachetools 999.0 is installed, constraints.txt pins {pins[canonicalize_name('cachetools')]}",
        "left-behind 1.0 is installed and the project needs it, but constraints.txt does not pin it",
    ]


def test_the_file_is_read_strictly() -> None:
    assert gen_constraints.read_pins("# a comment\nFoo_Bar==1.2  # why\n\nbaz==3\n") == {
        "foo-bar": Version("1.2"),
        "baz": Version("3"),
    }
    with pytest.raises(ValueError, match=re.escape("constraints.txt:2: not a pin (name==version): 'baz>=3'")):
        gen_constraints.read_pins("foo==1\nbaz>=3\n")
    with pytest.raises(ValueError, match=re.escape("constraints.txt:2: foo.bar is pinned twice")):
        gen_constraints.read_pins("foo-bar==1\nfoo.bar==2\n")


def test_written_pins_read_back_in_name_order() -> None:
    text = gen_constraints.write_pins({"b": "2", "A_x": "1"})
    assert text.startswith(gen_constraints.HEADER)
    assert text.endswith("A_x==1\nb==2\n")
    assert gen_constraints.read_pins(text) == {"a-x": Version("1"), "b": Version("2")}


def test_a_refresh_keeps_only_the_pins_pyproject_still_allows() -> None:
    wanted = [Requirement("grpcio>=1.85.1,<2"), Requirement("pyyaml>=6")]
    pins = {canonicalize_name(n): Version(v) for n, v in {"grpcio": "1.80", "pyyaml": "6.0.2", "six": "1.17"}.items()}
    assert gen_constraints.allowed(pins, wanted) == {"pyyaml": Version("6.0.2"), "six": Version("1.17")}
