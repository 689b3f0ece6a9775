"""The caller's side of the loader's wire (``bulldozer.cli.loader.to_json`` and
``flat_json``) writes and reads what the json module writes and reads, without importing it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bulldozer.cli.loader import flat_json, to_json

# what a caller sends: its arguments, working directory, environment (any text, a name's
# undecodable bytes as surrogates) and umask
REQUESTS = [
    {"op": "status"},
    {
        "argv": ["run", "job.yaml", "--json", "-q"],
        "cwd": "/srv/jobs/été",
        "env": {"A": 'quote " backslash \\ tab \t newline \n nul \x00', "B": "\udcff\udc80", "C": "日本 🚜", "D": ""},
        "umask": 0o022,
    },
    {"nested": [[], {}, [1, -2, "x"], {"k": [0]}]},
]

# what the loader answers a run (bulldozer.cli.loader.server): its pid, the command's exit
# code, or why it refused
REPLIES = [
    {"pid": 4242},
    {"exit": 0},
    {"exit": 143},
    {"exit": -1},
    {"refused": "upgraded"},
    {"refused": "stopping"},
    {"refused": "not this loader's home"},
    {"refused": 'é "quoted" \\ \n'},
    {"pid": 1, "exit": 2},
    {},
]


@pytest.mark.parametrize("message", REQUESTS + REPLIES)
def test_a_message_is_written_as_json_dumps_writes_it(message: dict[str, object]) -> None:
    assert to_json(message) == json.dumps(message)
    assert json.loads(to_json(message)) == message


@pytest.mark.parametrize("value", [1.5, None, True, b"x", {1: "x"}, {"a": object()}])
def test_a_value_json_would_write_otherwise_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        to_json({"v": value})


@pytest.mark.parametrize("reply", REPLIES)
def test_a_reply_is_read_as_json_loads_reads_it(reply: dict[str, object]) -> None:
    assert flat_json(json.dumps(reply).encode()) == reply


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"{",
        b"}",
        b"[1]",
        b'"pid"',
        b'{"pid": }',
        b'{"pid": -}',
        b'{"pid": 1,}',
        b'{"pid": 1 }',
        b'{"pid":1}',
        b'{"pid": 1}\n',
        b'{"pid": 1} ',
        b'{"pid": 1.5}',
        b'{"pid": [1]}',
        b'{"pid": null}',
        b'{"pid": "unterminated}',
        b'{"a": 1, "b"}',
        b"{pid: 1}",
        b"\xff\xfe",
        json.dumps({"pid": 1, "home": "/h", "children": [1]}).encode(),  # a status: read with json
    ],
)
def test_any_other_line_is_no_reply(line: bytes) -> None:
    assert flat_json(line) is None


def test_neither_imports_the_json_module() -> None:
    """What the caller of a warm run imports is what it pays before the loader takes over."""
    code = (
        "import sys\n"
        "from bulldozer.cli.loader import flat_json, to_json\n"
        "assert flat_json(to_json({'pid': 1, 'why': 'x'}).encode()) == {'pid': 1, 'why': 'x'}\n"
        "print(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
