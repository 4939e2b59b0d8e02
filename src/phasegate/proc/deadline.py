"""The deadline a lease gives the processes started under it: self-fencing.

An agent or check never outlives the lease it was started under
(docs/contracts/lifecycle.md: leases and fencing). A ``LeaseDeadline`` holds
two instants on ``deadline_clock()``: when the processes started under the
lease are stopped (``STOP_SHARE`` of the TTL after the last claim or renewal
was sent) and when what is left of them is killed (``KILL_SHARE``), both before
the lease can expire, since the lease runs a whole TTL from a moment after that
send. The heartbeat moves them on after each renewal (``extend``) and ends them
at once when the lease is lost (``end``).

The supervisor of each process (``phasegate.proc.supervisor``) reads them from a
small file and enforces them itself: it is a process of its own, in a
session of its own, so a worker stopped with SIGSTOP, hung, or cut off from
its store cannot extend them, and its processes stop in time all the same.
The file is written only once a process is started under the lease
(``file``), so an advance that starts none writes nothing; it is removed when
the lease is let go, and what a killed worker left by the next process that
writes one.

``governing(deadline)`` makes it the deadline of every process
``run_supervised`` starts on this thread (an advance runs its agents and
checks on its own thread).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from phasegate.proc.supervisor import deadline_clock

__all__ = [
    "KILL_SHARE",
    "STOP_SHARE",
    "LeaseDeadline",
    "current_deadline",
    "deadline_clock",
    "governing",
]

#: Shares of the lease's TTL after a renewal was sent: the processes are asked to stop
#: (SIGTERM) at the first and killed at the second. A renewal is sent every third of
#: the TTL, so one late renewal is no stop; what is left of the TTL is the margin
#: before another worker may claim the lease.
STOP_SHARE = 3 / 4
KILL_SHARE = 7 / 8

_CURRENT: ContextVar[LeaseDeadline | None] = ContextVar("phasegate_lease_deadline", default=None)


class LeaseDeadline:
    """The stop and kill instants of the processes started under one lease.

    ``ttl_s`` is the lease's TTL (seconds); ``sent_at`` when (``deadline_clock()``)
    the claim that took it was sent; ``lost`` the fence's event, set once the
    lease is known to be gone, which ends the deadline too. Thread-safe: the
    heartbeat extends it while the advance's thread starts processes.
    """

    def __init__(self, ttl_s: float, sent_at: float, lost: threading.Event | None = None) -> None:
        self.ttl_s = ttl_s
        self.lost = lost or threading.Event()
        #: Set once a process started under the lease was stopped at its deadline.
        self.fenced = threading.Event()
        self._lock = threading.Lock()
        self._stop, self._kill = sent_at + ttl_s * STOP_SHARE, sent_at + ttl_s * KILL_SHARE
        self._dir: Path | None = None
        self._closed = False

    @property
    def stop_at(self) -> float:
        """When (``deadline_clock()`` seconds) the processes are stopped, unless extended."""
        with self._lock:
            return self._stop

    def passed(self) -> bool:
        """Whether the processes started under the lease must stop now."""
        return self.lost.is_set() or deadline_clock() >= self.stop_at

    def extend(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (``deadline_clock()``) succeeded: move the
        instants on from there. Never moves them back, nor after ``end``."""
        with self._lock:
            stop = sent_at + self.ttl_s * STOP_SHARE
            if self._closed or self.lost.is_set() or stop <= self._stop:
                return
            self._stop, self._kill = stop, sent_at + self.ttl_s * KILL_SHARE
            self._write()

    def end(self) -> None:
        """The lease is lost (taken over, or not renewed for a whole TTL): every process
        started under it stops now, its supervisor sees to it."""
        self.lost.set()
        with self._lock:
            self._stop = self._kill = 0.0
            self._write()

    def file(self) -> Path:
        """The file a supervisor reads the instants from, written now if it was not yet.
        Raises OSError when the temp dir cannot take it."""
        with self._lock:
            if self._closed:
                raise OSError("the lease's deadline is closed")
            if self._dir is None:
                _sweep_once()
                self._dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
                if not self._write():
                    raise OSError(f"cannot write the lease's deadline in {self._dir}")
            return self._dir / "deadline"

    def close(self) -> None:
        """Remove the file: the lease is let go, nothing runs under it any more (a
        supervisor that still did would find no file, and stop)."""
        with self._lock:
            self._closed = True
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    def _write(self) -> bool:
        """Replace the file's content at once (called under the lock): a supervisor
        reads the old instants or the new ones, never a mix. False when it could not."""
        if self._dir is None or self._closed:
            return False
        stop, kill = (0.0, 0.0) if self.lost.is_set() else (self._stop, self._kill)
        fd, scratch = tempfile.mkstemp(dir=self._dir, prefix=".deadline-")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(f"{stop!r} {kill!r}\n")
            os.replace(scratch, self._dir / "deadline")
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(scratch)
            return False  # a deadline left unmoved stops the processes early, never late
        return True


_PREFIX = "phasegate-lease-"
_swept = threading.Event()


def _sweep_once() -> None:
    """Remove the deadline dirs of processes that are gone (a SIGKILLed worker could
    not close its own), once per process: their supervisors died with them."""
    if _swept.is_set():
        return
    _swept.set()
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: its dir is not ours to judge
    return True


def current_deadline() -> LeaseDeadline | None:
    """The deadline of the processes this thread starts (``governing``), if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def governing(deadline: LeaseDeadline) -> Iterator[LeaseDeadline]:
    """Within the block, every process ``run_supervised`` starts on this thread is
    stopped by ``deadline``."""
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)
