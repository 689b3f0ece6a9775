"""The import rules DESIGN.md's layout states, checked on the package's source: nothing
imports the command line (``bulldozer.cli``) but the command line itself, and no module
below it reads the process environment except ``bulldozer.settings``, the one reader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "bulldozer"
#: what reads or changes the process environment
ENVIRONMENT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _below_cli(path: Path) -> bool:
    return path.relative_to(PACKAGE).parts[0] != "cli"


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module ``tree`` imports, at any depth (a function's deferred imports too)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def environment_uses(tree: ast.AST) -> list[int]:
    """Lines where ``tree`` reads or changes the process environment through ``os``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & ENVIRONMENT:
            lines.append(node.lineno)
    return lines


def test_nothing_below_the_command_line_imports_it() -> None:
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in _modules()
        if _below_cli(path)
        for name in imported_modules(ast.parse(path.read_text()))
        if name == "bulldozer.cli" or name.startswith("bulldozer.cli.")
    ]
    assert found == []


def test_only_the_settings_module_reads_the_environment_below_the_command_line() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in _modules()
        if _below_cli(path) and path != PACKAGE / "settings.py"
        for line in environment_uses(ast.parse(path.read_text()))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "imports", "environment"),
    [
        ("def f():\n    from bulldozer.cli import process\n", True, False),
        ("import bulldozer.cli.main\n", True, False),
        ("from bulldozer import cli\n", True, False),
        ("import os\nx = os.environ.get('HOME')\n", False, True),
        ("from os import getenv\n", False, True),
        ("import os\nos.putenv('A', 'b')\n", False, True),
        ("import os\nx = os.path.join('a', 'b')\n", False, False),
    ],
)
def test_the_checks_see_what_they_look_for(source: str, imports: bool, environment: bool) -> None:
    tree = ast.parse(source)
    assert any(n == "bulldozer.cli" or n.startswith("bulldozer.cli.") for n in imported_modules(tree)) is imports
    assert bool(environment_uses(tree)) is environment
