"""The service scripts' installs and fetches (``scripts/services/common.sh``): once per
machine, one process at a time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.services import SCRIPTS

pytestmark = pytest.mark.integration


def test_two_scripts_doing_the_same_install_at_once_do_it_one_after_the_other(tmp_path: Path) -> None:
    """The suite's two workers each start their own Redis and Cassandra on first use, so on a
    new machine two scripts installed or fetched the same thing at once: one of two
    ``redis.sh install`` failed on dpkg's lock (exit 100), and two Cassandra fetches wrote one
    folder while the first started from it. ``with_lock`` runs the second after the first,
    which then finds the work done."""
    script = f"""
set -euo pipefail
. {SCRIPTS / "common.sh"}
step() {{
  if [ -f "{tmp_path}/done" ]; then echo found-done >>"{tmp_path}/log"; return 0; fi
  echo start >>"{tmp_path}/log"
  sleep 1
  touch "{tmp_path}/done"
  echo end >>"{tmp_path}/log"
}}
with_lock demo step
"""
    env = {"BULLDOZER_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    both = [subprocess.Popen(["bash", "-c", script], env=env) for _ in range(2)]
    assert [done.wait(timeout=60) for done in both] == [0, 0]
    assert (tmp_path / "log").read_text().split() == ["start", "end", "found-done"]
    assert (tmp_path / "cache" / "locks" / "demo.lock").is_file()


def test_a_failed_install_fails_the_script(tmp_path: Path) -> None:
    """What the locked command fails with, the script fails with (and the lock is free again)."""
    script = f"""
set -euo pipefail
. {SCRIPTS / "common.sh"}
with_lock demo false
echo not-reached
"""
    env = {"BULLDOZER_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    failed = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert failed.returncode == 1 and "not-reached" not in failed.stdout
    again = subprocess.run(["bash", "-c", script.replace("false", "true")], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.strip() == "not-reached"
