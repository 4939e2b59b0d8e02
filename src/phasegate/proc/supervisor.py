"""The supervisor every agent and check runs under, and the /proc reading it needs.

phasegate starts each process as ``python -I _supervisor.py PARENT STATUS_FD
MODE DEADLINE -- ARGS...``, in a session of its own. The supervisor

- makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant
  whose parent exits is re-parented to it, not to init, so a descendant that
  calls ``setsid()`` (leaves the process group) is still in its subtree;
- tags its subtree: the command's environment holds ``PHASEGATE_PROCESS_TAGS``
  with this supervisor's tag (boot, pid, start ticks), so a restarted worker
  finds what survived even a SIGKILL of the supervisor itself;
- dies with phasegate: ``PR_SET_PDEATHSIG`` sends it SIGTERM when the thread
  that started it exits (phasegate was killed), and it polls its parent too;
- fences itself: DEADLINE names a file (``-``: none) holding the lease's
  deadline, two instants on ``deadline_clock()`` (stop, kill) that the
  worker's heartbeat moves on after each renewal; once the stop instant
  passes unmoved (the worker is stopped, hung or cut off from its store) or
  the file is gone, it stops its subtree, SIGKILLing what is left at the
  kill instant, and exits with ``FENCED``, leaving a marker beside the file
  (``fenced_marker``). A stopped worker cannot move the instants, and this
  process, in a session of its own, is not stopped with it;
- on SIGTERM, parent death, or once the command exits, stops every remaining
  descendant (SIGTERM, then SIGKILL after a grace) and exits only when its
  subtree is gone, so the output pipes reach end of file.

It imports only the standard library and is run by path, so its start costs
no import of phasegate. ``phasegate.proc.process`` imports the /proc helpers below.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

TAG_VAR = "PHASEGATE_PROCESS_TAGS"
GRACE_S = 2.0  # seconds a stopped descendant has between SIGTERM and SIGKILL
SPAWN_FAILED = 127  # the supervisor's exit code when the command cannot start
FENCED = 125  # the supervisor's exit code when it stopped the command at the lease's deadline

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_POLL_S = 0.5  # how often the supervisor looks at its parent without a signal
_DEADLINE_POLL_S = 0.1  # how often it reads the deadline file: a lost lease is noticed at once
#: The clock of the deadline file: the same in every process of a host, and still
#: running while the machine sleeps (suspended for an hour, the lease is long gone).
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


# -- /proc ----------------------------------------------------------------------


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is gone.

    The name may hold spaces and parentheses; what follows the last ")" is
    fixed: state, ppid, pgrp, session, ... starttime is the 20th.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if unknown.

    With the pid, it names one process for good: a pid is reused, a
    (pid, start ticks) pair is not (within one boot).
    """
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), "" when unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_tag(pid: int, ticks: int | None) -> str:
    """The tag of the supervisor started at (``pid``, ``ticks``) in this boot."""
    return f"{boot_id()[:8]}.{pid}.{ticks}"


def process_table() -> dict[int, tuple[int, int, int]]:
    """Every live process: pid → (ppid, pgid, start ticks). Zombies are left out."""
    table: dict[int, tuple[int, int, int]] = {}
    if not Path("/proc").is_dir():
        return table  # no /proc (not Linux): only the process group can be stopped
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
            continue  # exited while we looked, or a zombie: nothing left to stop
        table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int, int]]) -> set[int]:
    """The pids below ``root`` in ``table`` (by ppid), ``root`` excluded."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def tagged(tag: str, table: dict[int, tuple[int, int, int]]) -> set[int]:
    """The pids in ``table`` whose environment carries ``tag`` in ``TAG_VAR``.

    A process of another user (unreadable environment) is never ours.
    """
    needle = f"{TAG_VAR}=".encode()
    found = set()
    for pid in table:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle) and tag.encode() in item[len(needle) :].split(b":"):
                found.add(pid)
                break
    return found


def signal_all(pids: set[int], table: dict[int, tuple[int, int, int]], sig: int) -> None:
    """Send ``sig`` to each pid that is still the process ``table`` saw.

    A pid that exited and was reused since ``table`` was read is never
    signalled: the process is pinned (a pidfd) before its start ticks are
    compared, so the process compared is the one signalled.
    """
    for pid in pids:
        expected = table[pid][2] if pid in table else None
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, PermissionError):
            continue
        except (AttributeError, OSError):  # no pidfd (old kernel): check, then signal
            if expected is None or start_ticks(pid) == expected:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            continue
        try:
            if expected is None or start_ticks(pid) == expected:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    signal.pidfd_send_signal(fd, sig)
        finally:
            os.close(fd)


# -- the lease's deadline ------------------------------------------------------------


def deadline_clock() -> float:
    """Seconds on the clock the deadline file is written in (CLOCK_BOOTTIME)."""
    return time.clock_gettime(_CLOCK)


def read_deadline(path: str) -> tuple[float, float]:
    """The (stop, kill) instants (``deadline_clock()`` seconds) in the deadline file at
    ``path``; (0, 0), long past, when it is gone or unreadable: a supervisor that
    cannot tell its lease is held must not go on."""
    try:
        stop, kill = (float(field) for field in Path(path).read_text().split())
    except (OSError, ValueError):
        return 0.0, 0.0
    return stop, kill


def _grace(deadline: str | None) -> float:
    """Seconds a stopped descendant has before SIGKILL: ``GRACE_S``, or less once the
    lease's stop instant passed, so that the subtree is gone by its kill instant."""
    if deadline is None:
        return GRACE_S
    stop, kill = read_deadline(deadline)
    now = deadline_clock()
    return GRACE_S if now < stop else max(0.0, min(GRACE_S, kill - now))


def fenced_marker(deadline: str, supervisor: int) -> Path:
    """The file the supervisor ``supervisor`` leaves beside the deadline file when it
    stopped its command at the deadline: its exit code alone could be the command's."""
    return Path(deadline).with_name(f"fenced.{supervisor}")


def _say_fenced(deadline: str, me: int) -> None:
    with contextlib.suppress(OSError):  # the lease let go meanwhile: nobody asks
        fenced_marker(deadline, me).touch()


# -- the supervisor ---------------------------------------------------------------


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl; False where there is none (the ppid poll still stops the
    subtree when phasegate dies, but an orphaned descendant goes to init)."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return False
    if prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    return True


def _reap() -> dict[int, int]:
    """Reap every exited child (ours or re-parented to us): pid → wait status."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def _stop_subtree(me: int, tag: str, grace_s: float = GRACE_S) -> None:
    """SIGTERM every descendant (by ppid, and by tag), SIGKILL what outlives ``grace_s``."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        _reap()
        table = process_table()
        left = (descendants(me, table) | tagged(tag, table)) - {me}
        if not left:
            return
        signal_all(left, table, sig)
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig = signal.SIGKILL
            continue
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    parent, status_fd, mode = int(argv[0]), int(argv[1]), argv[2]
    deadline = None if argv[3] == "-" else argv[3]
    command = argv[5:]
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    # The death signal comes when the *thread* that started us exits: phasegate's
    # thread waits in run_supervised until we exit, so only its death sends it.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return SPAWN_FAILED  # phasegate died before the death signal was armed
    me = os.getpid()
    tag = process_tag(me, start_ticks(me))
    env = dict(os.environ)
    env[TAG_VAR] = ":".join(filter(None, [env.get(TAG_VAR, ""), tag]))
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)

    argv_ = ["/bin/sh", "-c", command[0]] if mode == "shell" else command
    if deadline is not None and deadline_clock() >= read_deadline(deadline)[0]:
        _say_fenced(deadline, me)
        return FENCED  # the lease may be another worker's already: start nothing
    os.set_inheritable(status_fd, False)  # closed by a successful exec: EOF means started
    pid = os.fork()
    if pid == 0:
        try:
            # The command must not inherit the blocked signals, and dies if we do.
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(SPAWN_FAILED)  # we died before the death signal was armed
            os.execvpe(argv_[0], argv_, env)
        except OSError as exc:
            shown = command[0] if mode == "shell" else command
            os.write(status_fd, f"cannot start {shown!r}: {exc}".encode())
        os._exit(SPAWN_FAILED)
    os.close(status_fd)
    status: int | None = None
    while status is None:
        got = signal.sigtimedwait(_WATCHED, _POLL_S if deadline is None else _DEADLINE_POLL_S)
        status = _reap().get(pid)
        if status is None and (
            (got is not None and got.si_signo != signal.SIGCHLD) or os.getppid() != parent
        ):
            _stop_subtree(me, tag, _grace(deadline))
            return 128 + signal.SIGTERM
        if status is None and deadline is not None:
            stop, kill = read_deadline(deadline)
            now = deadline_clock()
            if now >= stop:
                _stop_subtree(me, tag, max(0.0, min(GRACE_S, kill - now)))
                _say_fenced(deadline, me)
                return FENCED
    # The command is done; what it left running (a server, a setsid'd sleeper)
    # must not outlive it, nor hold the output pipes open.
    _stop_subtree(me, tag)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # SIGKILL has no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.kill(me, sig)  # die as the command died, so the exit status says how
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
