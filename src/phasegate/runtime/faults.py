"""What a phase's exception means for its workflow: a pause a person or a retry ends, or a failure.

A phase must never crash the engine half-committed, so the engine turns what
a phase raised into a PhaseResult and commits it like any other. Faults of the
world around the work (git's locks, the forge, a check the OS cannot start, no
free port range) pause the workflow with the reason, so ``resume`` tries again
once they are gone; an unavailable forge's pause is resumed by itself too (``runtime.outage``).
Anything else fails the workflow with the exception's words.
"""

from __future__ import annotations

import logging

from phasegate.config.cartridge import CARTRIDGE_FILE
from phasegate.core.contract import PhasegateError, PhaseResult
from phasegate.forge.base import ForgeAuthError, ForgeNotFound, ForgeUnavailable
from phasegate.git.checks import CheckUnstartable
from phasegate.git.workspace import GitTransient
from phasegate.store import PortsUnavailable

__all__ = ["FORGE_PAUSE", "fault_result"]

log = logging.getLogger("phasegate.runtime.engine")

#: How the reason of a pause on an unavailable forge starts: the worker resumes
#: those by itself (``phasegate.runtime.outage``).
FORGE_PAUSE = "forge_unavailable: "

#: The faults that pause: the exception's class, the reason's prefix and its ending.
_PAUSES: tuple[tuple[type[Exception], str, str], ...] = (
    # The cartridge's to fix: no phase's failure.
    (CheckUnstartable, "", f"; fix it in {CARTRIDGE_FILE}, commit it, then resume"),
    # git kept failing on a lock: resume retries.
    (GitTransient, "", ""),
    # Past its retries and rate-limit waits: the worker resumes it (outage.py).
    (ForgeUnavailable, FORGE_PAUSE, ""),
    # A token or permission to fix; the work itself is sound.
    (ForgeAuthError, "forge_auth: ", ""),
    # A repository renamed or out of the token's sight.
    (ForgeNotFound, "forge_not_found: ", ""),
    # Every port range taken: ended workflows give theirs back.
    (PortsUnavailable, "", "; once workflows end (or with fewer ports), resume"),
)


def fault_result(phase: str, workflow_id: str, exc: Exception) -> PhaseResult:
    """The result to commit for ``exc``, raised by ``phase`` of ``workflow_id``: a
    pause for the faults of ``_PAUSES``, else ``failed`` naming the exception.
    Logs it: a warning, with the traceback when it is no PhasegateError."""
    for kind, prefix, ending in _PAUSES:
        if isinstance(exc, kind):
            log.warning("phase %s of %s paused: %s", phase, workflow_id, exc)
            reason = f"{prefix}{phase}: {exc}{ending}"
            asked = getattr(exc, "retry_after_s", None)
            if asked is None:
                return PhaseResult("pause", reason=reason)
            # The forge's own wait: no automatic resume comes before it has passed.
            return PhaseResult("pause", reason=reason, state={"forge_retry_after_s": asked})
    if isinstance(exc, PhasegateError):  # expected: its message says it all
        log.warning("phase %s of %s: %s", phase, workflow_id, exc)
    else:
        log.exception("phase %s of %s raised", phase, workflow_id)
    return PhaseResult("failed", reason=f"{phase}: {type(exc).__name__}: {exc}")
