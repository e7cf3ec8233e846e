"""Files a user names for output (``calibrate --output``, ``study best --export``, report
and comparison folders): checked before anything is computed or written, and written
together or not at all (docs/architecture.md, "Layers": with errors and units, the lowest
layer, so every layer that writes a user-named file can use it).

* :func:`check_output` — a path is a regular file (replaced) or a new path in a folder
  this process can create files in; a directory, a FIFO, a device, a socket or an
  unwritable place is a :class:`~crossflow.errors.ConfigError` naming the option and the
  path.  Nothing is opened, so a FIFO never blocks.
* :func:`check_output_folder` — the same for an output folder.
* :class:`OutputFiles` — several files written to temporary files beside their final
  paths and renamed into place together at :meth:`OutputFiles.commit`; on any error the
  temporary files are removed and nothing that existed is replaced.  With
  ``overwrite=False`` a file that exists (the named one or any side file) is refused,
  listing every such file.
* :func:`silence` — a standard stream whose reader went away (``crossflow … | head``) is
  pointed at the null device, so that later writes and the interpreter's flush at exit
  do not fail again.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from crossflow.errors import ConfigError


def silence(stream) -> None:
    """Point ``stream``'s file descriptor (``sys.stdout``, ``sys.stderr``) at the null
    device: its reader went away, and nothing written there can reach anyone."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, stream.fileno())
    finally:
        os.close(null)


def _kind_of_file(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _creatable(path: Path) -> str | None:
    """Why ``path`` (which does not exist) cannot be created, else None."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot be created: {folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot be created: the directory {folder} is not writable"
    return None


def check_output(path: Path, option: str, what: str = "the output") -> None:
    """Raise a ConfigError unless ``path`` is a regular file or a new path in a folder this
    process can create files in.  Nothing is opened or written: a FIFO is never blocked on.

    The message names ``option`` (the option or argument that gave the path), the whole
    path and ``what`` the file is (e.g. "the GEMM CSV written beside the preset").
    """
    path = Path(path)
    problem, st = None, None
    if str(path) in ("", "."):
        problem = "is an empty name"
    else:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            problem = f"cannot be inspected ({exc.strerror})"
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            problem = f"is {_kind_of_file(st.st_mode)}"
        elif not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK | os.X_OK):
            # (replacing it needs a temporary file beside it and a rename in its folder)
            problem = "exists and is not writable"
    elif problem is None:
        problem = _creatable(path)
    if problem:
        raise output_error(path, option, what, problem)


def check_output_folder(path: Path, option: str, what: str = "the output folder") -> None:
    """Raise a ConfigError unless ``path`` is a writable directory or a new path that can be
    created as one."""
    path = Path(path)
    problem = None
    if str(path) == "":
        problem = "is an empty name"
    else:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            problem = _creatable(path)
        except OSError as exc:
            problem = f"cannot be inspected ({exc.strerror})"
        else:
            if not stat.S_ISDIR(st.st_mode):
                problem = f"is {_kind_of_file(st.st_mode)}, not a directory" \
                    if not stat.S_ISREG(st.st_mode) else "is a file, not a directory"
            elif not os.access(path, os.W_OK | os.X_OK):
                problem = "is a directory this process cannot write to"
    if problem:
        raise ConfigError(f"{path} ({what}) {problem}; nothing was written",
                          file="command line" if option.startswith("-") else None,
                          key=option, allowed="a writable directory or a new path")


def output_error(path: Path, option: str, what: str, problem: str) -> ConfigError:
    """The one-paragraph error about an output path (the option, the path, what it is)."""
    return ConfigError(
        f"{path} ({what}) {problem}; nothing was written",
        file="command line" if option.startswith("-") else None, key=option,
        allowed="a regular file (replaced) or a new path in a writable directory")


class OutputFiles:
    """Files written together: each to a temporary file beside it, renamed into place at
    :meth:`commit`; until then (and on any error) nothing replaces an existing file.

    ``outputs`` lists ``(path, option, what)``: the option that named the path and how
    messages call the file.  All are checked with :func:`check_output` and their temporary
    files created on entry, so an unwritable place is reported before any work is done.
    ``overwrite=False`` refuses, before anything is written, when any of the files exists
    (the message lists them and names ``force``, the option that allows it).
    """

    def __init__(self, outputs: Sequence[tuple[Path, str, str]], *, overwrite: bool = True,
                 force: str = "--force") -> None:
        self.outputs = [(Path(p), option, what) for p, option, what in outputs]
        self.overwrite, self.force = overwrite, force
        self.temps: dict[Path, Path] = {}

    def __enter__(self) -> OutputFiles:
        for final, option, what in self.outputs:
            check_output(final, option, what)
        if not self.overwrite:
            existing = [final for final, _, _ in self.outputs if os.path.lexists(final)]
            if existing:
                option = self.outputs[0][1]
                raise ConfigError(
                    f"{'these files exist' if len(existing) > 1 else 'this file exists'} "
                    f"and would be replaced: {', '.join(str(p) for p in existing)}; nothing "
                    "was written", file="command line" if option.startswith("-") else None,
                    key=option, value=str(self.outputs[0][0]),
                    allowed=f"a path whose files do not exist yet, or {self.force} to "
                    "replace them")
        try:
            for final, option, what in self.outputs:
                try:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    self.temps[final] = _temp_beside(final)
                except OSError as exc:
                    raise output_error(final, option, what,
                                       f"cannot be written ({exc.strerror or exc})") from None
        except BaseException:
            self._discard()
            raise
        return self

    def temp(self, final: Path) -> Path:
        """The temporary file to write ``final``'s content to."""
        return self.temps[Path(final)]

    def commit(self) -> None:
        """Rename every temporary file into place, all at the end."""
        for final, tmp in list(self.temps.items()):
            try:
                os.replace(tmp, final)
            except OSError as exc:
                option, what = next((o, w) for p, o, w in self.outputs if p == final)
                raise output_error(final, option, what,
                                   f"cannot be written ({exc.strerror or exc})") from None
            del self.temps[final]

    def __exit__(self, *exc: object) -> None:
        self._discard()

    def _discard(self) -> None:
        for tmp in self.temps.values():
            tmp.unlink(missing_ok=True)
        self.temps.clear()


def _temp_beside(path: Path) -> Path:
    """An empty temporary file in ``path``'s folder (so the final rename is atomic)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes it 0600; the result is an ordinary shared file
    return Path(name)
