"""The name of the machine a worker runs on, as its leases and process journal say it.

A lease owner is ``host:pid:token`` (``Engine.owner``): a holder on this host
whose process is gone is taken over at once, one on another host only once its
lease expired (``store.leases``); an agent a dead worker left running is
stopped only from its own host (``journal.ProcessJournal``). ``PHASEGATE_HOSTNAME``
names the machine when the kernel's node name does not tell machines apart:
containers sharing the host's UTS namespace (or started with one name), or a
test playing two machines on one.
"""

from __future__ import annotations

import os
from pathlib import Path

from phasegate.core.contract import PhasegateError

__all__ = ["HOSTNAME_VARIABLE", "holder_alive", "host_name"]

#: The variable that names this machine in lease owners and process milestones.
HOSTNAME_VARIABLE = "PHASEGATE_HOSTNAME"


#: The longest host name a lease owner may carry: the owner (``host:pid:token``)
#: must fit the store's 255-character column.
MAX_HOST_NAME = 200


def host_name() -> str:
    """``PHASEGATE_HOSTNAME`` when set (and not blank), else the kernel's node name.

    Raises PhasegateError when the name holds a ``:`` (it separates the parts of
    a lease owner), whitespace or a control character (``status`` prints it), or
    is longer than ``MAX_HOST_NAME`` characters.
    """
    name = os.environ.get(HOSTNAME_VARIABLE, "").strip() or os.uname().nodename
    if ":" in name:
        raise PhasegateError(f"{HOSTNAME_VARIABLE}={name!r}: a host name must not contain ':'")
    if any(not ch.isprintable() or ch.isspace() for ch in name):
        raise PhasegateError(
            f"{HOSTNAME_VARIABLE}={name!r}: a host name must not hold spaces or control characters"
        )
    if len(name) > MAX_HOST_NAME:
        raise PhasegateError(
            f"{HOSTNAME_VARIABLE}: a host name of {len(name)} characters is longer than "
            f"{MAX_HOST_NAME}"
        )
    return name


def holder_alive(holder: str) -> bool:
    """Whether the lease holder ``host:pid:...`` may still be running.

    Only a holder on this host (``host_name``: PHASEGATE_HOSTNAME or the node
    name) can be checked; any other is assumed alive until its lease expires.
    """
    parts = holder.split(":")
    if len(parts) < 2 or parts[0] != host_name() or not parts[1].isdigit():
        return True
    pid = int(parts[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it: it runs
    nothing more, though signals still find it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no procfs to ask: a process signals find is taken as running
    return stat.rpartition(")")[2].split()[:1] == ["Z"]
