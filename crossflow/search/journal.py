"""The journal file of a study, made to survive a write that did not finish.

Optuna's journal storage appends one JSON record per line to a file, under a lock.  A
writer that dies in the middle of a record (killed, out of disk space, out of quota)
leaves a *torn tail*: a last line without its end.  Optuna skips such a line while it is
last, but the next append lands on the same line, and from then on every read of the file
fails with ``JSONDecodeError`` — the study can no longer be shown, resumed or exported.

:class:`SafeJournalBackend` keeps a study readable through that:

* **on open** it checks the file once, under the journal's lock: a torn tail is cut off,
  and a record glued onto a torn one (a file damaged before this check existed) is
  recovered; the bytes removed are kept in ``<journal>.torn`` and the repair is reported
  once on stderr.  Every complete record before the damage is kept.
* **on append** it checks the last byte under the lock (a torn tail left by a writer that
  died since is cut off the same way) and, when the write fails (``ENOSPC``, ``EDQUOT``,
  ``EFBIG``, ``EIO``), cuts the file back to where it was and raises
  :class:`JournalWriteError`: a clear message, the records already written intact, and
  the same command resumes once there is room.
* **durability** as a database's: a record that ends a trial, creates one or changes the
  study is synced, flushing every record before it; a running trial's own records are
  written at once but not synced each (:data:`_UNSYNCED`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file

from crossflow.errors import ConfigError, CrossflowError

#: Suffix of the file that keeps the bytes a repair removed.
TORN_SUFFIX = ".torn"
#: Optuna's op codes of the records written while a trial runs: its parameters, its
#: intermediate values and its attributes (JournalOperation 5, 7, 8, 9).  They are written
#: at once, so every worker sees them, but made durable only with the next record that is
#: not one of them (the trial's state or result, a new trial, anything of the study), as a
#: database commits a transaction: that fsync flushes every record before it.  A trial
#: takes two fsyncs instead of one a record (29 for quickstart's); a machine that loses
#: power mid-trial loses at most the records of the trials running then.  A killed process
#: loses nothing either way (its writes are in the kernel's cache).
_UNSYNCED = frozenset({5, 7, 8, 9})
#: Journals already reported as repaired by this process (the repair is said once).
_REPORTED: set[str] = set()
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
         errno.EFBIG: "the file size limit is reached"}


class JournalWriteError(CrossflowError):
    """A record could not be written to a study's journal; nothing half-written is left."""


class JournalLostError(CrossflowError):
    """A study's journal was deleted or moved away while a command had it open."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: the study's journal was deleted or moved away while this command ran "
            "(no such file any more); the launch stops here. Put the journal back (from a "
            "backup, or where it was moved) and run the same command again to resume; run "
            "without it and the study starts afresh.")


def check_journal_path(path: str | Path, key: str = "storage", *,
                       for_reading: bool = False) -> Path:
    """``path`` as a journal location, or a :class:`ConfigError` when it cannot be one: an
    existing file that is not a regular file (a device such as ``/dev/full``, a FIFO, a
    socket), a directory, or a folder that cannot be written.  Nothing is created.
    ``for_reading``: only read (``study show``): a file that can be read will do, wherever
    it is; a missing one is left to the caller (no study there)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"cannot use this journal file ({exc.strerror})", key=key,
                          value=str(path)) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError("is a directory, not a journal file", key=key, value=str(path),
                              allowed="a file path (created when missing) or a database URL")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("is not a regular file (a device, FIFO or socket): a journal "
                              "must be a file of its own", key=key, value=str(path),
                              allowed="a file path (created when missing) or a database URL")
        if for_reading and not os.access(path, os.R_OK):
            raise ConfigError("cannot be read by this user", key=key, value=str(path))
        if not for_reading and not os.access(path, os.R_OK | os.W_OK):
            raise ConfigError("cannot be read and written by this user", key=key,
                              value=str(path))
        return path
    if for_reading:
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create the journal: {parent} is not a writable folder",
                          key=key, value=str(path))
    return path


def writable(path: str | Path) -> bool:
    """Whether this process can append to the journal at ``path``: the file and its folder
    (where the lock file is made) can be written.  A read-only file system says no to root
    too."""
    path = Path(path)
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


class ReadOnlyJournalBackend(JournalFileBackend):
    """A journal read where nothing can be written (a read-only mount, another user's
    folder): no lock file, no repair on disk.  A torn tail is skipped and glued records are
    recovered in memory, as :class:`SafeJournalBackend` would on disk; damage inside is
    refused the same way.  Any write raises :class:`JournalWriteError`."""

    def __init__(self, file_path: str) -> None:  # (the base class would create the file)
        self._file_path = file_path
        self._lock = None
        self._log_number_offset = {0: 0}
        self._read: tuple[int, list[bytes]] = (-1, [])
        self._records()  # damage is said when the journal is opened, not mid-command

    def _records(self) -> list[bytes]:
        """The journal's records, read again only when the file has grown (Optuna syncs
        before most reads; a writer elsewhere may append)."""
        try:
            with open(self._file_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == self._read[0]:
                    return self._read[1]
                data = fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read the study's journal ({exc.strerror or exc})",
                              key="storage", value=self._file_path) from None
        keep, _, _ = _salvage(data, self._file_path)
        self._read = (size, keep.splitlines())
        return self._read[1]

    def read_logs(self, log_number_from: int):
        for line in self._records()[log_number_from:]:
            yield json.loads(line)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise JournalWriteError(
            f"{self._file_path}: the study's journal cannot be written here (read-only); "
            "this command only reads it, and something tried to write")


class SafeJournalBackend(JournalFileBackend):
    """Optuna's journal file backend that survives torn records (see the module doc)."""

    def __init__(self, file_path: str, lock_obj: Any = None) -> None:
        check_journal_path(file_path)
        try:
            super().__init__(file_path, lock_obj)
            with get_lock_file(self._lock):
                self._repair()
        except OSError as exc:
            why = _FULL.get(exc.errno, exc.strerror or str(exc))
            raise ConfigError(f"cannot open the study's journal ({why})", key="storage",
                              value=file_path) from None

    # ------------------------------------------------------------------ repair

    def _repair(self) -> None:
        """Cut a torn tail and recover glued records (under the lock)."""
        path = self._file_path
        with open(path, "rb") as fh:
            data = fh.read()
        if not data:
            return
        keep, removed, glued = _salvage(data, path)
        if not removed:
            return
        if keep == data[: len(keep)]:
            _save_torn(path, data[len(keep):])
            os.truncate(path, len(keep))  # earlier records keep their offsets
        else:
            _save_torn(path, b"".join(removed))
            tmp = f"{path}.repair-{os.getpid()}"
            with open(tmp, "wb") as fh:
                fh.write(keep)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            self._log_number_offset = {0: 0}
        _report(path, keep.count(b"\n"), sum(len(r) for r in removed), glued,
                tail=not data.endswith(b"\n"))

    def _cut_torn_tail(self, fd: int) -> int:
        """The file size after cutting a torn tail off (under the lock; ``fd`` is the
        journal, open for reading and writing)."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return size
        # a writer died mid-record since this process opened the file: find its start
        start = max(0, size - (1 << 20))
        tail = os.pread(fd, size - start, start)
        cut = start + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
        torn = os.pread(fd, size - cut, cut)
        _save_torn(self._file_path, torn)
        os.ftruncate(fd, cut)
        _report(self._file_path, None, len(torn))
        return cut

    def read_logs(self, log_number_from: int):
        try:
            yield from super().read_logs(log_number_from)
        except FileNotFoundError:  # (Optuna's own error would surface in a worker thread)
            raise JournalLostError(self._file_path) from None

    # ------------------------------------------------------------------ append

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        try:
            with get_lock_file(self._lock):
                fd = os.open(self._file_path, os.O_RDWR | os.O_APPEND)
                size = None
                try:
                    size = self._cut_torn_tail(fd)
                    _write_all(fd, text.encode("utf-8"))
                    if any(log.get("op_code") not in _UNSYNCED for log in logs):
                        os.fsync(fd)
                except OSError:
                    # no torn record left behind (if even that fails, the next open cuts it)
                    if size is not None:
                        with contextlib.suppress(OSError):
                            os.ftruncate(fd, size)
                    raise
                finally:
                    os.close(fd)
        except OSError as exc:  # the write, or the lock file (a full disk refuses both)
            if exc.errno == errno.ENOENT and not os.path.exists(self._file_path):
                raise JournalLostError(self._file_path) from None
            why = _FULL.get(exc.errno, exc.strerror or str(exc))
            raise JournalWriteError(
                f"{self._file_path}: cannot write the study's journal ({why}). The records "
                f"written before are intact; free space (or move the journal with "
                f"--storage) and run the same command again to resume.") from None


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (a short write is continued; an error raises)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


#: Optuna's op code of the record that creates a study (a journal's first record).
_CREATE_STUDY = 0


def _salvage(data: bytes, path: str) -> tuple[bytes, list[bytes], list[int]]:
    """(the complete records of a journal's bytes, the byte runs that were removed, the
    line numbers where a torn record was cut off a record glued to it).

    Only what a writer that stopped mid-write leaves is repaired: a last line without its
    end, and a torn record with the next writer's record glued on.  Anything else (a whole
    line that is no record, a journal that does not begin by creating a study) was damaged
    some other way, and cutting it out would lose or orphan the study's trials: a
    :class:`ConfigError` naming the file and the line, with nothing changed."""
    keep: list[bytes] = []
    removed: list[bytes] = []
    glued: list[int] = []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends with a newline
    if tail:
        removed.append(tail)
    for number, line in enumerate(lines, 1):
        if _is_record(line):
            keep.append(line)
            continue
        # a torn record with a complete one glued on: the last '{' at which a record starts
        at = line.rfind(b'{"op_code"')
        while at > 0 and not _is_record(line[at:]):
            at = line.rfind(b'{"op_code"', 0, at)
        if at <= 0:
            raise _damaged(path, number, line, "is no journal record")
        removed.append(line[:at])
        keep.append(line[at:])
        glued.append(number)
    if keep and json.loads(keep[0]).get("op_code") != _CREATE_STUDY:
        raise _damaged(path, 1, lines[0], "is not the record that creates the study")
    return b"".join(r + b"\n" for r in keep), removed, glued


def _damaged(path: str, number: int, line: bytes, what: str) -> ConfigError:
    first = " (the record that creates the study)" if number == 1 else ""
    shown = line[:60].decode("utf-8", "replace") + ("..." if len(line) > 60 else "")
    return ConfigError(
        f"line {number}{first} {what}: {shown!r}; the journal is damaged inside, which no "
        "writer stopping mid-write does, so it is neither repaired nor written to (a new "
        "study would orphan the trials recorded after it); nothing was changed",
        file=path, allowed="the journal restored from a backup, or another --storage for "
        "a new study")


def _is_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and "op_code" in record


def _save_torn(path: str, torn: bytes) -> None:
    if not torn:
        return
    try:
        with open(path + TORN_SUFFIX, "ab") as fh:
            fh.write(torn + b"\n")
    except OSError:
        pass  # keeping the evidence must not stop the repair (e.g. the disk is still full)


def _report(path: str, records: int | None, nbytes: int, glued: Sequence[int] = (),
            tail: bool = True) -> None:
    if path in _REPORTED:
        return
    _REPORTED.add(path)
    kept = f"the {records} complete records are kept" if records is not None else \
        "every complete record is kept"
    where = []
    if glued:  # the lines as they were numbered before the repair
        where.append(f"line{'s' if len(glued) > 1 else ''} "
                     f"{', '.join(map(str, glued[:5]))}{', ...' if len(glued) > 5 else ''} "
                     "began with a record that was not finished, the next one glued to it")
    if tail:
        where.append("it ended in a record that was not finished")
    print(f"crossflow: note: {path}: {' and '.join(where)} "
          f"(a writer stopped mid-write); {kept}, the {nbytes} torn bytes are saved in "
          f"{path}{TORN_SUFFIX}.", file=sys.stderr)
