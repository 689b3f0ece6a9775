"""The FileIO a run's tables are read with: a local file is read only if it is a regular
file, and a planned data or delete file only where ``warehouse.files`` allows it, as opened.

``files.checked_tasks`` checks every data and delete file a run will read against the
table's location and the operator's roots, resolving symbolic links as the file system
does at that moment. The reader opens the file later, by its path: a table's owner who can
write in its folder could swap a file checked there for a symbolic link (to another team's
table) in between, and the run would read what the link points at. So the planned files are
registered with the table's FileIO (``hold_inside``), and each one is opened by this FileIO
first, then checked on its descriptor — where ``/proc/self/fd`` says the kernel found it,
which no later swap changes — and read through that very descriptor's file
(``/proc/self/fd/N``, opened again by pyarrow: its native file, at native speed).

Every local file a table's FileIO opens (its manifests too: their paths are the table
owner's text) is opened without blocking and must be a regular file: a FIFO in a file's
place held the run in pyarrow's open until a writer came, which none does (and a SIGTERM
did not end that wait). An object store's objects are opened by the table's own FileIO.

Every FileIO a table is read with is one of these (``catalog``: the catalogs' FileIO hook
and the embedded catalog's static table); local reads of Spark's JVM are not: it opens the
files itself.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from typing import Any

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile

from bulldozer.errors import SourceDataError

__all__ = ["CheckedFileIO", "checked_io"]

#: a place files may lie under: ``files._parts`` of a real path (scheme, host, path)
Place = tuple[str, str, str]

#: where the kernel says an open descriptor's file is (Linux; elsewhere files are opened unchecked)
_FD_LINKS = "/proc/self/fd"
_CHECKED = os.path.isdir(_FD_LINKS)


def checked_io(io: FileIO) -> CheckedFileIO:
    """``io`` as a table's FileIO whose local files are checked as they are opened."""
    return io if isinstance(io, CheckedFileIO) else CheckedFileIO(io)


class CheckedFileIO(FileIO):
    """A table's FileIO (``inner``) that opens local files itself (``_CheckedFile``)."""

    def __init__(self, inner: FileIO) -> None:
        super().__init__(inner.properties)
        self.inner = inner
        #: a registered file's location -> its table's location, and the places it must lie under
        self._held: dict[str, tuple[str, tuple[Place, ...]]] = {}

    def hold_inside(self, location: str, allowed: Iterable[Place], paths: Iterable[str]) -> None:
        """Open ``paths`` (the local ones of a table's files, as its manifests list them) only
        when the file opened lies under one of ``allowed``: the table's ``location`` and the
        operator's roots, as ``files.outside`` resolved them."""
        from bulldozer.warehouse.files import is_local

        held = (location, tuple(allowed))
        self._held.update((path, held) for path in paths if is_local(path))

    def new_input(self, location: str) -> InputFile:
        from bulldozer.warehouse.files import is_local

        inner = self.inner.new_input(location)
        return _CheckedFile(inner, self._held.get(location)) if _CHECKED and is_local(location) else inner

    def new_output(self, location: str) -> OutputFile:
        return self.inner.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self.inner.delete(location)


class _CheckedFile(InputFile):
    """A local file, opened by ``open`` as the module says: only a regular file; a
    registered one (``held``: its table's location and places) only where it may lie."""

    def __init__(self, inner: InputFile, held: tuple[str, tuple[Place, ...]] | None) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self._held = held

    def __len__(self) -> int:
        return len(self._inner)

    def exists(self) -> bool:
        return self._inner.exists()

    def open(self, seekable: bool = True) -> InputStream:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import PyArrowFileIO

        from bulldozer.warehouse.files import lies_under, outside_error

        _, _, path = PyArrowFileIO.parse_location(self.location)  # the path pyiceberg's own FileIO opens
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:  # said as pyiceberg's FileIO says it
            raise FileNotFoundError(f"Cannot open file, does not exist: {self.location}") from None
        except PermissionError:
            raise PermissionError(f"Cannot open file, access denied: {self.location}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SourceDataError(
                    f"the file {self.location} is not a regular file (a device, FIFO or socket); nothing is read "
                    "from it"
                )
            link = f"{_FD_LINKS}/{fd}"
            if self._held is not None:
                table, places = self._held
                real = os.readlink(link)
                if not lies_under(real, places):
                    raise outside_error(table, f"{self.location} (as opened, a symbolic link to {real})")
            opened: Any = pa.OSFile(link, "r")  # the descriptor's file, not the path's: a new swap is not followed
        finally:
            os.close(fd)
        return opened  # type: ignore[no-any-return]
