"""What ``watch`` and ``worker`` share to watch the forge: the GitHub repository a
cartridge names, the progress lines of a start or an ignore, and ``watching``,
the watch beside a worker loop (``forge.watch_in_worker``, ``watch --work``).

Commandless, so ``worker`` (cli/workflows.py) uses it without changing the
order ``--help`` lists the commands in.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from phasegate.cli._app import UsageError, shown
from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge
from phasegate.core.contract import PhasegateError
from phasegate.forge.base import ForgeUnavailable
from phasegate.integrations.triggers import (
    Commanded,
    Ignored,
    Started,
    TicketSnapshot,
    Watcher,
    repository_of,
    watch_forever,
)
from phasegate.operations import MAX_TICKET_BYTES
from phasegate.phases.forge_feedback import COMMAND_PREFIX
from phasegate.runtime.engine import Engine
from phasegate.runtime.pace import ForgePace
from phasegate.store import StoreUnavailable

__all__ = [
    "Reporter",
    "github_repository",
    "reporter",
    "ticket_note",
    "unavailable",
    "watch_in_worker",
    "watching",
]

log = logging.getLogger(__name__)

#: Intervals the watching beside a worker waits after an error that needs a person
#: before it looks again, and the longest such wait in seconds.
PERSON_WAITS = 10
MAX_PERSON_WAIT_S = 900.0


def github_repository(command: str, root: Path, cartridge: Cartridge) -> str:
    """The cartridge's team forge repository (GitHub's ``owner/name``, GitLab's
    ``group/…/name``, Gitea's ``owner/name``); UsageError with the local forge."""
    settings = cartridge.forge
    if settings.kind == "local":
        raise UsageError(
            f'{command} needs a team forge (forge.kind = "github", "gitlab" or "gitea") in '
            f"{CARTRIDGE_FILE} (this cartridge has the local forge, whose tickets come from "
            '`phasegate run "ticket"`)'
        )
    return repository_of(settings.repository, root, settings.base_url, settings.kind)


def ticket_note(snapshot: TicketSnapshot) -> str:
    """Whose words the ticket has, and how many comments were left out, for a person."""
    left = f"; {snapshot.left_out} comment(s) by others left out" if snapshot.left_out else ""
    return f"ticket by {shown(', '.join(snapshot.authors))}{left}"


def result_line(result: Started | Ignored | Commanded) -> str:
    if isinstance(result, Commanded):
        said = f"{COMMAND_PREFIX} {result.command} by {shown(result.by)}"
        if result.refused:
            return (
                f"[yellow]#{result.issue_number}: {said} refused: {shown(result.refused)}[/yellow]"
            )
        return f"#{result.issue_number}: {said}: workflow [bold]{result.workflow_id}[/bold]"
    if isinstance(result, Started):
        return (
            f"#{result.issue_number}: workflow [bold]{result.workflow_id}[/bold] started "
            f"(labelled by {shown(result.labelled_by)}; {ticket_note(result.snapshot)})"
        )
    return f"[yellow]#{result.issue_number}: ignored: {shown(result.reason)}[/yellow]"


class Reporter:
    """Says each start, ignore or command of a look: a line for a person, or
    with ``as_json`` one JSON object a line, flushed, so a script reads them as
    they come. ``told`` counts them."""

    def __init__(self, as_json: bool, say: Callable[[str], None]) -> None:
        self.as_json, self.say, self.told = as_json, say, 0

    def __call__(self, result: Started | Ignored | Commanded) -> None:
        self.told += 1
        if self.as_json:
            self._write(result.as_dict())
        else:
            self.say(result_line(result))

    def nothing(self, watcher: Watcher) -> None:
        """After one look (``--once``) that found nothing: with ``as_json`` an
        object saying so, in the shape of the others, so a script always reads
        one at least."""
        if self.as_json and not self.told:
            self._write({"event": "nothing", "repository": watcher.repository,
                         "label": watcher.label})  # fmt: skip

    @staticmethod
    def _write(shown: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(shown) + "\n")
        sys.stdout.flush()


def reporter(as_json: bool, say: Callable[[str], None]) -> Reporter:
    return Reporter(as_json, say)


def unavailable(
    say: Callable[[str], None],
) -> Callable[[ForgeUnavailable | StoreUnavailable], None]:
    def tell(exc: ForgeUnavailable | StoreUnavailable) -> None:
        say(f"[yellow]looking again later: {shown(str(exc))}[/yellow]")

    return tell


@contextmanager
def watching(
    engine: Engine,
    watcher: Watcher,
    *,
    once: bool,
    interval_s: float | Callable[[], float],
    report: Callable[[Started | Ignored | Commanded], None],
    say: Callable[[str], None],
) -> Iterator[None]:
    """Watch beside a worker loop run inside the block: with ``once``, one pass
    now (what it starts the loop then advances); else a thread polling every
    ``interval_s`` seconds, so a long agent run never delays a trigger, stopped
    when the block ends. An error that needs a person (a refused token, a
    repository not found) pauses the watching, loudly, never the worker: it looks
    again after PERSON_WAITS of its intervals (at most MAX_PERSON_WAIT_S), so a
    token put right on the forge is watched with again without a restart."""
    if once:
        for result in watcher.watch_once():
            report(result)
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                watch_forever(watcher, stop, interval_s, report, unavailable(say))
                return
            except PhasegateError as exc:
                every = interval_s() if callable(interval_s) else interval_s
                again = min(every * PERSON_WAITS, MAX_PERSON_WAIT_S)
                log.error(
                    "watching %s paused: %s; looking again in %.0f s",
                    watcher.repository,
                    exc,
                    again,
                )
                say(
                    f"[red]watching paused: {shown(str(exc))}; looking again in {again:.0f} s[/red]"
                )
                stop.wait(again)

    thread = threading.Thread(target=loop, name="phasegate-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


@contextmanager
def watch_in_worker(
    root: Path, cartridge: Cartridge, engine: Engine, *, once: bool, say: Callable[[str], None]
) -> Iterator[None]:
    """``phasegate worker``'s hook: ``watching`` the cartridge's repository every
    ``forge.poll_s`` seconds (``forge.webhook_poll_s`` while webhooks arrive:
    ``ForgePace``) when ``forge.watch_in_worker = true``, else nothing."""
    if not cartridge.forge.watch_in_worker:
        yield
        return
    repository = github_repository("forge.watch_in_worker", root, cartridge)
    watcher = Watcher(engine, repository, max_ticket_bytes=MAX_TICKET_BYTES)
    say(f"watching {repository} for the label {watcher.label!r}")
    with watching(
        engine,
        watcher,
        once=once,
        interval_s=ForgePace(cartridge, engine.store, repository).wait_s,
        report=reporter(False, say),
        say=say,
    ):
        yield
