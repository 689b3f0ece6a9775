"""The embedded store is its owner's alone: its folder 0700 and its files 0600, and another
user's command is refused in one line naming the owner. Light (no engine imported): a
command asks ``owner_refusal`` before it starts the DAL that opens the store."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["make_private", "owner_refusal"]


def make_private(path: Path) -> None:
    """The store at ``path`` made its owner's alone: its folder 0700, its files 0600 (also a
    store created before this rule, and whatever the umask)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    for child in path.iterdir():
        if child.is_file() and not child.is_symlink():
            os.chmod(child, 0o600)


def owner_refusal(path: Path) -> str | None:
    """Why this user may not open the embedded store at ``path`` (a store folder, or the home
    it would be made in): it belongs to another user, whose alone it is (``make_private``;
    root may open any). None where that is not so, or cannot be told (then opening says)."""
    for folder in (path, path.parent):
        try:
            owner = folder.stat().st_uid
        except PermissionError:
            continue  # not even to be looked into: its home may say whose it is
        except OSError:
            return None
        if os.geteuid() in (0, owner):
            return None
        import pwd

        try:
            name = f"{pwd.getpwuid(owner).pw_name!r} (uid {owner})"
        except KeyError:
            name = f"uid {owner}"
        whose = "it belongs" if folder == path else f"its home {folder} belongs"
        return (
            f"cannot open the embedded store at {path}: {whose} to user {name}, and the store is its owner's "
            "alone; run the command as that user, or have that user serve the store (`bulldozer serve`) and "
            "name its DAL (--endpoint, BULLDOZER_ENDPOINT)"
        )
    return None
