"""Commands trusted people type in comments on a workflow's issue or pull request,
applied through operations (docs/github.md: what people type).

``/phasegate resume``, ``/phasegate cancel``, ``/phasegate verify confirmed``
and ``/phasegate verify rejected <reason>``, as a comment's first line
(``forge_feedback.command_of``; ``/phasegate merge`` is wait's). They move
workflows no phase is running for, so the watcher reads them
(``Watcher.watch_once``), on every workflow of its repository that waits for a
person (NEEDS_YOU_STATUSES, and failed): each is applied by the operation a
person at the terminal would run, with that operation's rules, ``by`` the
comment's author. A comment a webhook delivered is read on an ended workflow
too (completed, cancelled), so its author is told why nothing happened; polling
leaves ended workflows alone, as their comments would cost a call each look.

Only people with write, maintain or admin permission command; anyone else's
command is refused and never reaches a prompt (wait leaves every command out of
its feedback). Each command acts once: the decision it made names its comment
(``{"comment": "kind:id"}`` in the ``decision`` event, committed with the
decision), and a command refused (untrusted, or the workflow's state does not
admit it) is remembered by a ``forge_command`` event; a trusted person is told
why in a reply on the forge. A command that met a
workflow held by a worker is read again at the next look. Comments on the issue
before its workflow started (``state.heard_comments``) were its ticket, never
commands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from phasegate import operations
from phasegate.core.contract import (
    ENDED_STATUSES,
    NEEDS_YOU_STATUSES,
    ContractViolation,
    EventWrite,
)
from phasegate.forge.base import Comment, ForgeError, TrustCache, access_names, shown_number
from phasegate.phases.forge_feedback import COMMAND_PREFIX, command_of
from phasegate.runtime.engine import Engine, LeaseHeld

__all__ = ["COMMAND_EVENT", "LISTENED_STATUSES", "Commanded", "listen"]

log = logging.getLogger(__name__)

#: The event that remembers a command refused: ``{"comment", "by", "command", "refused"}``.
COMMAND_EVENT = "forge_command"
#: The statuses whose workflows' comments are read for commands.
LISTENED_STATUSES = NEEDS_YOU_STATUSES | {"failed"}

_VERDICTS = ("confirmed", "rejected")


@dataclass(frozen=True)
class Commanded:
    """A command read on the forge: applied, or ``refused`` and why."""

    issue_number: int
    workflow_id: str
    command: str
    by: str
    comment: str
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": "commanded",
            "issue": self.issue_number,
            "workflow_id": self.workflow_id,
            "command": self.command,
            "by": self.by,
            "comment": self.comment,
            "refused": self.refused,
        }


def listen(
    engine: Engine,
    repository: str,
    trust: TrustCache,
    stop: Callable[[], bool],
    numbers: Collection[int] | None = None,
) -> list[Commanded]:
    """Apply the new commands on every listened workflow of ``repository`` (this
    engine's clone's, by the store), oldest comment first; returns what each did.
    ``numbers``: only the workflows whose issue or pull request is one of them (a
    webhook's comment), ended workflows among them. ``stop``: asked between
    workflows (a shutdown). Raises ForgeError (ForgeUnavailable: the commands not
    applied yet are read again next time)."""
    statuses = LISTENED_STATUSES if numbers is None else LISTENED_STATUSES | ENDED_STATUSES
    done: list[Commanded] = []
    for row in engine.store.list_workflows(statuses):
        if stop():
            break
        if row["status"] not in statuses or not row.get("issue_number"):
            continue
        if numbers is not None and not {row["issue_number"], row.get("pr_number")} & set(numbers):
            continue
        if row.get("repository") not in (repository, None) or (
            row.get("repository") is None and row["repo_path"] != str(engine.repo)
        ):
            continue
        done += _listen_to(engine, row, trust)
    return done


def _heard(engine: Engine, row: dict[str, Any]) -> set[str]:
    """The comments no command is read from: the issue's before its workflow
    started, and each one acted on or refused."""
    events = engine.store.events(row["id"], types=(operations.DECISION_EVENT, COMMAND_EVENT))
    acted = {str(e["data"]["comment"]) for e in events if (e.get("data") or {}).get("comment")}
    return acted | {str(k) for k in row["state"].get("heard_comments") or ()}


def _listen_to(engine: Engine, row: dict[str, Any], trust: TrustCache) -> list[Commanded]:
    numbers = [int(row["issue_number"])]
    if row.get("pr_number") and row["pr_number"] != row["issue_number"]:
        numbers.append(int(row["pr_number"]))
    said = [(n, c) for n in numbers for c in engine.forge.comments(n)]
    heard = _heard(engine, row)
    done = []
    for number, c in sorted(said, key=lambda x: (x[1].created_at, x[1].id)):
        command = command_of(c.body)
        if command is None or c.key in heard:
            continue
        # what is shown of it: the command, and verify's verdict; never more words
        verdict = command[1].split()[:1] if command[0] == "verify" else []
        name = " ".join([command[0], *verdict])[:40]
        refused: str | None
        if not trust.trusted(c.author):
            names = access_names(engine.cartridge.forge.kind)
            refused = (
                f"{c.author or 'someone unknown'}, {names.whose(trust.permission(c.author))}: "
                f"only {names.trusted} command phasegate"
            )
        else:
            try:
                refused = _apply(engine, row["id"], command, c)
            except LeaseHeld:
                break  # a worker holds it now: read again at the next look
        if refused is not None:
            if trust.trusted(c.author):  # an outsider gets no answer to argue with
                _answer(engine, row["id"], number, c, f"`{COMMAND_PREFIX} {name}`: {refused}")
            data = {"comment": c.key, "by": c.author, "command": name, "refused": refused}
            engine.store.add_event(row["id"], EventWrite(COMMAND_EVENT, data))
            log.warning(
                "%s %s on %s ignored: %s", COMMAND_PREFIX, name, shown_number(number), refused
            )
        else:
            log.info("%s %s on %s by %s", COMMAND_PREFIX, name, shown_number(number), c.author)
        heard.add(c.key)
        done.append(Commanded(int(row["issue_number"]), row["id"], name, c.author, c.key, refused))
    return done


def _answer(engine: Engine, workflow_id: str, number: int, c: Comment, text: str) -> None:
    """Tell the person on the forge why their command did nothing, once per
    command (found again by its marker). Best effort: the refusal is recorded
    in the store whether the forge takes the answer or not."""
    marker = f"phasegate:{workflow_id}:command:{c.key}"
    try:
        if engine.forge.find_comment(number, marker) is None:
            engine.forge.comment(number, f"@{c.author} {text}", marker)
    except ForgeError as exc:
        log.warning("no answer to %s on #%s: %s", c.key, number, exc)


def _apply(engine: Engine, workflow_id: str, command: tuple[str, str], c: Comment) -> str | None:
    """Apply one trusted command through operations; None when it acted, else why
    it did not (the operation's refusal, or a command phasegate does not know).
    Raises LeaseHeld, ForgeError."""
    what, rest = command
    by, via = c.author, c.key
    verdict, reason = [*rest.split(None, 1), "", ""][:2]
    try:
        if what == "resume":
            operations.resume(engine, workflow_id, by=by, via=via)
        elif what == "cancel":
            operations.cancel(engine, workflow_id, by=by, via=via)
        elif what == "verify" and verdict.lower() in _VERDICTS:
            if verdict.lower() == "rejected" and not reason.strip():
                return f"say why: {COMMAND_PREFIX} verify rejected <reason>"
            operations.verify_override(
                engine, workflow_id, verdict.lower(), by=by, reason=reason, via=via
            )
        elif what == "verify":
            return f"{COMMAND_PREFIX} verify takes confirmed or rejected <reason>"
        else:
            return f"no command {what!r}: resume, cancel, verify, merge"
    except (ContractViolation, operations.ActionRefused) as exc:
        return str(exc)
    return None
