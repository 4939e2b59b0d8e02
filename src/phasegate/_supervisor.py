"""The supervisor every agent and check runs under, and the /proc reading it needs.

phasegate starts each process as ``python -I _supervisor.py PARENT STATUS_FD
MODE -- ARGS...``, in a session of its own. The supervisor

- makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant
  whose parent exits is re-parented to it, not to init, so a descendant that
  calls ``setsid()`` (leaves the process group) is still in its subtree;
- tags its subtree: the command's environment holds ``PHASEGATE_PROCESS_TAGS``
  with this supervisor's tag (boot, pid, start ticks), so a restarted worker
  finds what survived even a SIGKILL of the supervisor itself;
- dies with phasegate: ``PR_SET_PDEATHSIG`` sends it SIGTERM when the thread
  that started it exits (phasegate was killed), and it polls its parent too;
- on SIGTERM, parent death, or once the command exits, stops every remaining
  descendant (SIGTERM, then SIGKILL after a grace) and exits only when its
  subtree is gone, so the output pipes reach end of file.

It imports only the standard library and is run by path, so its start costs
no import of phasegate. ``phasegate._process`` imports the /proc helpers below.
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

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_POLL_S = 0.5  # how often the supervisor looks at its parent without a signal


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
    reaped = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def _stop_subtree(me: int, tag: str) -> None:
    """SIGTERM every descendant (by ppid, and by tag), SIGKILL what outlives the grace."""
    deadline = time.monotonic() + GRACE_S
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
    command = argv[4:]
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
        got = signal.sigtimedwait(_WATCHED, _POLL_S)
        status = _reap().get(pid)
        if status is None and (
            (got is not None and got.si_signo != signal.SIGCHLD) or os.getppid() != parent
        ):
            _stop_subtree(me, tag)
            return 128 + signal.SIGTERM
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
