"""Every process phasegate starts (agents, checks) runs here: supervised, bounded, stoppable.

``run_supervised`` starts a command under ``phasegate.proc.supervisor`` (a child
subreaper that dies with phasegate), feeds it its input, reads its output
with a deadline, and on a timeout or a cancellation stops its whole subtree,
including descendants that left its process group with ``setsid()``. Under
a lease (``phasegate.proc.deadline.governing``) it is stopped too when the
lease's deadline passes: by this process, and by the supervisor itself when
this process cannot (stopped, hung).
``kill_orphan_group`` is what a restarted worker uses to stop what a dead
one left running (``SideEffects.reconcile``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phasegate.proc import supervisor as _supervisor
from phasegate.proc.changes import note_change
from phasegate.proc.deadline import LeaseDeadline, current_deadline
from phasegate.proc.sandbox import Confinement, sandbox_for
from phasegate.proc.supervisor import (
    boot_id,
    descendants,
    process_table,
    process_tag,
    signal_all,
    start_ticks,
    tagged,
)

__all__ = [
    "Finished",
    "SpawnError",
    "boot_id",
    "kill_orphan_group",
    "run_supervised",
    "start_ticks",
]

_POLL_S = 0.2  # how often a running process looks for a cancellation
_DRAIN_S = 2.0  # seconds the output may still flow once the supervisor is done
_SUPERVISOR = str(Path(_supervisor.__file__).resolve())


class SpawnError(OSError):
    """The command could not be started (no such program, bad cwd, ...)."""


@dataclass(frozen=True)
class Finished:
    """How a supervised process ended: its output (text), exit code (None when it
    was stopped), seconds, and ``stopped`` ("timeout", "interrupted", "fenced": the
    lease's deadline passed, or None)."""

    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float
    stopped: str | None = None


def kill_orphan_group(pgid: int, ticks: int | None) -> bool:
    """SIGKILL what a process started by a dead worker left running; returns whether it killed.

    ``pgid`` and ``ticks`` name the supervisor (or, for rows written before
    supervisors, the agent) the worker journaled. Killed: its process group,
    only when the group is ours (its leader is the process that started at
    ``ticks``, or the leader is gone and members remain: Linux does not hand
    out a pid still in use as a process group id), and every process that
    carries the supervisor's tag, wherever it went with ``setsid()``. A pid
    that was reused is never killed: the tag names one supervisor for good.
    """
    table = process_table()
    leader = start_ticks(pgid)
    ours = leader is None or ticks is None or leader == ticks
    targets = tagged(process_tag(pgid, ticks), table) if ticks is not None else set()
    if ours:
        targets |= {pid for pid, (_, group, _ticks) in table.items() if group == pgid}
        if leader is not None:
            targets |= descendants(pgid, table)
    if not targets:
        return False
    signal_all(targets, table, signal.SIGKILL)
    return True


def run_supervised(
    args: str | Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float,
    cancel: threading.Event | None,
    on_spawn: Callable[[int], None] | None = None,
    merge_stderr: bool = False,
    confinement: Confinement | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
) -> Finished:
    """Run ``args`` (a shell command when a string) in ``cwd`` to its end, its timeout
    (seconds) or ``cancel``; returns what it wrote and how it ended.

    ``env`` is the command's whole environment (None: this process's);
    ``stdin`` its input (None: /dev/null); with ``merge_stderr`` its stderr
    goes to ``stdout``. ``on_spawn(pid)`` learns the supervisor's pid (its
    process group) before the command works, to journal it; if it raises,
    the process is stopped and the error re-raised. Raises SpawnError when
    the command cannot start. Returns within about ``timeout_s`` plus the
    grace (2 s) plus the drain (2 s), whatever the command's descendants do.

    Started under a lease (``phasegate.proc.deadline.governing`` on this thread),
    the process stops, ``stopped="fenced"``, once the lease's deadline passes
    (``LeaseDeadline.passed``): this thread stops it, and its supervisor does
    even when this whole process is stopped or hung; a command started after
    the deadline does not start at all.

    A ``confinement`` that is confined runs the command inside its sandbox
    (``phasegate.proc.sandbox``; a shell command as ``/bin/sh -c``) with a private
    temp dir (``TMPDIR``) made for this run and removed after it; the
    supervisor stays outside, so stopping works the same.

    ``on_output(stream, data)`` ("stdout" or "stderr", raw bytes as read) sees
    the output as it comes, on this thread, before the process ends: what an
    agent's live output is made of (``agents.output``). It must return at once
    and never raise; what it is given is in the returned Finished all the same.
    """
    # An agent or a check may write its checkout: what phasegate saw of it is stale.
    note_change()
    lease = current_deadline()
    try:
        if confinement is None or not confinement.confined:
            return _run(
                args, cwd, env, stdin, timeout_s, cancel, on_spawn, merge_stderr, on_output, lease
            )
        tmp = Path(os.path.realpath(tempfile.mkdtemp(prefix="phasegate-tmp-")))
        try:
            argv = ["/bin/sh", "-c", args] if isinstance(args, str) else list(args)
            wrapped = sandbox_for(confinement).wrap(argv, confinement, cwd, tmp)
            return _run(
                wrapped,
                cwd,
                env,
                stdin,
                timeout_s,
                cancel,
                on_spawn,
                merge_stderr,
                on_output,
                lease,
            )
        finally:
            # The subtree is gone by now (the supervisor saw to it): what is left is scratch.
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        note_change()


def _run(
    args: str | Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float,
    cancel: threading.Event | None,
    on_spawn: Callable[[int], None] | None,
    merge_stderr: bool,
    on_output: Callable[[str, bytes], None] | None = None,
    lease: LeaseDeadline | None = None,
) -> Finished:
    started = time.monotonic()
    command = [args] if isinstance(args, str) else list(args)
    try:
        deadline_file = "-" if lease is None else str(lease.file())
    except OSError as exc:
        raise SpawnError(exc.errno, f"cannot start {args!r}: {exc}") from exc
    status_r, status_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                _SUPERVISOR,
                str(os.getpid()),
                str(status_w),
                "shell" if isinstance(args, str) else "exec",
                deadline_file,
                "--",
                *command,
            ],
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
        )
    except OSError as exc:
        os.close(status_r)
        shown = repr(args) if len(repr(args)) <= 300 else f"{repr(args)[:300]}…"  # may be huge
        raise SpawnError(exc.errno, f"cannot start {shown}: {exc}") from exc
    finally:
        os.close(status_w)
    # Written after Popen, yet no window is left unjournaled: a phasegate
    # killed before on_spawn returns takes the supervisor with it (PDEATHSIG),
    # and the supervisor its subtree.
    ticks = start_ticks(proc.pid)
    try:
        with os.fdopen(status_r, "rb") as status:
            if on_spawn is not None:
                on_spawn(proc.pid)
            failure = status.read().decode("utf-8", "replace")
    except BaseException:
        _stop(proc, ticks)
        raise
    if failure:
        proc.wait()
        _close(proc)
        raise SpawnError(failure)
    pump = _Pump(proc, stdin, on_output)
    deadline = started + timeout_s
    stopped: str | None = None
    while not pump.done():
        if proc.poll() is not None:
            if proc.returncode < 0:
                _sweep(proc.pid, ticks)
            # The supervisor exits only once its subtree is gone; output still
            # open after that is held by something outside it: stop reading soon.
            pump.run_until(time.monotonic() + _DRAIN_S)
            break
        if cancel is not None and cancel.is_set():
            stopped = "interrupted"
        elif lease is not None and lease.passed():
            stopped = "fenced"
        elif time.monotonic() >= deadline:
            stopped = "timeout"
        if stopped is not None:
            _stop(proc, ticks)
            pump.run_until(time.monotonic() + _DRAIN_S)
            break
        pump.run_until(min(deadline, time.monotonic() + _POLL_S))
    if stopped is None:
        # End of file comes as the supervisor exits, a moment before it can be reaped.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_DRAIN_S)
    if proc.poll() is None:
        _stop(proc, ticks)
    proc.wait()
    if deadline_file != "-":
        marker = _supervisor.fenced_marker(deadline_file, proc.pid)
        if marker.exists():  # its supervisor stopped it (this process may have been stopped)
            stopped = stopped or "fenced"
            marker.unlink(missing_ok=True)
    if stopped == "fenced" and lease is not None:
        lease.fenced.set()
    _close(proc)
    out, err = pump.output()
    return Finished(
        out,
        err,
        None if stopped else proc.returncode,
        time.monotonic() - started,
        stopped=stopped,
    )


def _stop(proc: subprocess.Popen[bytes], ticks: int | None) -> None:
    """Stop ``proc``'s subtree: ask the supervisor (SIGTERM), then SIGKILL whatever is
    left of it (its group, its descendants, its tag) if it did not finish in time."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    # A supervisor stuck past its grace: the sweep below does its work.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_supervisor.GRACE_S + 1.0)
    for _ in range(50):
        table = process_table()
        left = tagged(process_tag(proc.pid, ticks), table) if ticks is not None else set()
        if proc.poll() is None:
            left |= descendants(proc.pid, table) | {proc.pid}
        left |= {pid for pid, (_, group, _ticks) in table.items() if group == proc.pid}
        if not left:
            break
        signal_all(left, table, signal.SIGKILL)
        time.sleep(0.02)
    proc.wait()


def _sweep(supervisor: int, ticks: int | None) -> None:
    """SIGKILL what still carries the tag of ``supervisor``, which died of a signal.

    A supervisor killed outright (SIGKILL, the OOM killer) stops nothing: its
    command dies of the death signal, but a descendant that left with
    ``setsid()`` lives on, and so does a sandbox whose init had not yet armed
    its own death signal when the supervisor died (bwrap arms it only after
    starting the command). Both carry the tag; killing bwrap's init takes the
    whole PID namespace with it.
    """
    if ticks is None:
        return
    table = process_table()
    left = tagged(process_tag(supervisor, ticks), table)
    if left:
        signal_all(left, table, signal.SIGKILL)


def _close(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


class _Pump:
    """Writes the input and reads stdout/stderr of a process without blocking on
    either: a pipe held open by a stray descendant cannot hold phasegate up."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        stdin: str | None,
        on_output: Callable[[str, bytes], None] | None = None,
    ) -> None:
        self._selector = selectors.DefaultSelector()
        self._on_output = on_output
        self._chunks: dict[int, list[bytes]] = {}
        self._input = memoryview((stdin or "").encode("utf-8"))
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                self._chunks[stream.fileno()] = []
                self._selector.register(stream.fileno(), selectors.EVENT_READ)
        self._out = proc.stdout.fileno() if proc.stdout is not None else -1
        self._err = proc.stderr.fileno() if proc.stderr is not None else -1
        if proc.stdin is not None:
            fd = proc.stdin.fileno()
            os.set_blocking(fd, False)
            self._stdin = proc.stdin
            if self._input:
                self._selector.register(fd, selectors.EVENT_WRITE)
            else:
                self._close_stdin()

    def _close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()

    def done(self) -> bool:
        """Whether every output pipe reached end of file."""
        return not any(key.events & selectors.EVENT_READ for key in self._registered())

    def _registered(self) -> list[selectors.SelectorKey]:
        return list(self._selector.get_map().values())

    def run_until(self, deadline: float) -> None:
        """Move bytes until ``deadline`` (monotonic seconds) or every output pipe closed."""
        while not self.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, _ in self._selector.select(remaining):
                if key.events & selectors.EVENT_WRITE:
                    self._write(key.fd)
                else:
                    self._read(key.fd)

    def _write(self, fd: int) -> None:
        try:
            sent = os.write(fd, self._input[:65536])
        except BlockingIOError:
            return
        except BrokenPipeError:
            sent = len(self._input)  # it exited without reading its input; its exit code decides
        self._input = self._input[sent:]
        if not self._input:
            self._selector.unregister(fd)
            self._close_stdin()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data:
            self._chunks[fd].append(data)
            if self._on_output is not None:
                self._on_output("stdout" if fd == self._out else "stderr", data)
        else:
            self._selector.unregister(fd)

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) as text; undecodable bytes replaced."""
        self._selector.close()

        def text(fd: int) -> str:
            raw = b"".join(self._chunks.get(fd, [])).decode("utf-8", "replace")
            # Universal newlines, as a text-mode Popen gave them before.
            return raw.replace("\r\n", "\n").replace("\r", "\n")

        return text(self._out), text(self._err)
