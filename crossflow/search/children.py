"""Child processes that go with their parent: on its exit, on every signal, on a crash.

A child started with :func:`spawn_child` runs in its own session (so the terminal's Ctrl-C
reaches only the parent, which decides what to do) and, on Linux, has
``PR_SET_PDEATHSIG`` set (``prctl(2)``, from a ``preexec_fn``): when the parent dies —
even by SIGKILL, where no handler of the parent runs — the kernel sends the child SIGTERM.
Caveat of ``prctl``: the signal follows the death of the parent *thread* that started the
child, so start long-lived children from the main thread (or a thread that lives as long).

A child that starts processes of its own (``mlflow ui`` starts uvicorn, and maybe job
consumers) needs more: the death signal reaches only the direct child, and its own
children would be re-parented to PID 1 and go on serving.  :func:`spawn_group` puts a
small supervisor (:func:`_supervise`, this file run as a script, stdlib only) between the
parent and the command: it is the process-group leader and a child subreaper
(``PR_SET_CHILD_SUBREAPER``, so orphaned descendants become its children), has the death
signal set, and on SIGINT/SIGTERM/SIGHUP — or when the command exits — signals the whole
group, waits up to :data:`GRACE_S` and SIGKILLs what is left.  :func:`forward_signals`
is the parent's side: it forwards those signals to the child and kills the child's group
when the parent is done with it.  :func:`forked` runs a function in a forked child while
the parent works on (the MLflow logging process draws a study's two summary figures so).

Used by the MLflow logging process and ``crossflow ui`` (:mod:`crossflow.search.tracking`);
``crossflow.search.workers`` may use :func:`spawn_child` for study workers.  Stdlib only, no
``crossflow`` import: the supervisor runs this file as a script.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: Signals a parent forwards to its children, and the supervisor to its group.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How long processes get between SIGTERM (or the forwarded signal) and SIGKILL.
GRACE_S = 10.0

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def preexec(deathsig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``deathsig`` when this process (the
    calling thread) dies, and that sends it at once if the parent died before the child
    set it; None where ``prctl`` is unavailable (not Linux).  ``prctl`` is looked up here,
    in the parent: the forked child only calls it."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def set_deathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, int(deathsig), 0, 0, 0)
        if os.getppid() != parent:  # the parent is already gone
            os.kill(os.getpid(), int(deathsig))

    return set_deathsig


def spawn_child(cmd: Sequence[str], *, deathsig: int = signal.SIGTERM,
                **popen_kw: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kw)`` in a new session (its own process group, led by
    the child: ``os.killpg(proc.pid, sig)`` reaches it and whatever it starts), with
    ``deathsig`` sent to it when this process dies (Linux)."""
    popen_kw.setdefault("start_new_session", True)
    fn = preexec(deathsig)
    if fn is not None:
        popen_kw["preexec_fn"] = fn
    return subprocess.Popen(list(cmd), **popen_kw)


def spawn_group(cmd: Sequence[str], **popen_kw: Any) -> subprocess.Popen:
    """:func:`spawn_child` of a supervisor that runs ``cmd`` and takes it and everything it
    started down with it (see the module docstring); the returned process is the
    supervisor, the leader of the group.  Its exit status is the command's, or 128 + the
    signal that stopped it."""
    script = os.path.abspath(__file__)
    # -P: this file's directory (crossflow/search) is not put first on sys.path
    return spawn_child([sys.executable, "-P", script, *cmd], **popen_kw)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid`` (Linux: from ``/proc``;
    elsewhere ``[pgid]`` while the group has any process)."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    out = []
    for pid, fields in _proc_stats():
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def _proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, [state, ppid, pgrp, ...]) of every process, from ``/proc/<pid>/stat``."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        yield int(name), text[text.rindex(")") + 2:].split()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGTERM,
               grace: float = GRACE_S) -> int | None:
    """Stop ``proc`` (started by :func:`spawn_child`, so the leader of its group) and every
    process of its group: ``sig`` to the group, up to ``grace`` seconds for them to exit,
    then SIGKILL.  Returns ``proc``'s exit status."""
    pgid = proc.pid
    if proc.poll() is None or group_members(pgid):
        _signal_group(pgid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not group_members(pgid):
            return proc.returncode
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    return proc.wait()


def take_signal(sig: int, handler: Callable[[int, Any], None]) -> Any:
    """``signal.signal(sig, handler)`` unless ``sig`` is ignored: a signal the process was
    started ignoring stays ignored (``nohup`` ignores SIGHUP so that a study or a server
    outlives its terminal; a shell starts a background job ignoring SIGINT), as Python
    itself leaves an ignored SIGINT alone at start-up.  Returns the handler to restore
    (None: nothing was installed)."""
    if signal.getsignal(sig) is signal.SIG_IGN:
        return None
    previous = signal.signal(sig, handler)
    # installed outside Python: Python's own defaults
    if previous is None:
        previous = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`take_signal` returned (None: nothing to put back)."""
    for sig, handler in previous.items():
        if handler is not None:
            signal.signal(sig, handler)


@contextlib.contextmanager
def forward_signals(proc: subprocess.Popen, signals: Sequence[int] = FORWARDED, *,
                    send: int | None = None) -> Iterator[list[int]]:
    """While inside: ``signals`` received by this process are sent to ``proc`` (``send``
    instead, when given; the numbers received are appended to the yielded list; this
    process does not stop by them); a signal this process ignores stays ignored and is not
    forwarded (``nohup crossflow ui`` outlives its terminal).  On leaving, in every case:
    :func:`kill_group` of ``proc``.  Handlers are installed only in the main thread
    (Python's rule); elsewhere only the final kill applies."""
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(send if send is not None else signum)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            old[sig] = take_signal(sig, handler)
    try:
        yield received
    finally:
        try:
            kill_group(proc)
        finally:
            restore_signals(old)


def _supervise(cmd: Sequence[str], grace: float = GRACE_S) -> int:
    """Run ``cmd`` and stop it and all it started together (see the module docstring)."""
    prctl = _prctl()
    if prctl is not None:  # orphaned descendants become ours: we reap and kill them
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopped: list[int] = []
    me, pgid = os.getpid(), os.getpgrp()

    def on_signal(signum: int, frame: Any) -> None:
        if not stopped:
            stopped.append(signum)
            for sig in FORWARDED:  # the group signal below reaches us too
                signal.signal(sig, signal.SIG_IGN)
            _signal_group(pgid, signum)

    for sig in FORWARDED:
        signal.signal(sig, on_signal)
    main = os.posix_spawnp(cmd[0], list(cmd), os.environ)
    code: int | None = None
    deadline: float | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child (nor adopted orphan) left
            break
        if pid == main:
            code = os.waitstatus_to_exitcode(status)
        if pid:
            continue
        if code is not None and not stopped:  # the command exited: its group goes too
            on_signal(signal.SIGTERM, None)
        if stopped and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            for pid, fields in _proc_stats() if prctl is not None else ():
                if pid != me and (int(fields[1]) == me or int(fields[2]) == pgid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if prctl is None:
                _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + grace
        time.sleep(0.05 if stopped else 0.5)
    if stopped and (code is None or code < 0):
        return 128 + stopped[0]
    return code if code is not None and code >= 0 else 128 - (code or 0)


def forked(fn: Callable[[], str], timeout_s: float) -> Callable[[], str]:
    """Start ``fn`` (which returns a short string) in a forked child process; return a
    function that waits for the child and returns ``fn``'s result.  Where there is no
    ``fork``, or the child fails or takes more than ``timeout_s`` (it is then killed), that
    function calls ``fn`` itself.  Fork only from a process whose other threads hold no
    lock the child needs (the import lock, say): the child inherits them held."""
    if not hasattr(os, "fork"):
        return fn
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return fn
    if pid == 0:  # the child: fn's result down the pipe, then out without any clean-up
        status = 1
        try:
            os.close(read)
            os.write(write, fn().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)

    def result() -> str:
        with os.fdopen(read, "rb") as pipe:
            ready, _, _ = select.select([pipe], [], [], timeout_s)
            got = pipe.read() if ready else b""
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return got.decode() if ready and status == 0 else fn()

    return result


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
