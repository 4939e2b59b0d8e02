"""Needs-you notifications: a webhook and the desktop.

What is notified: each ``needs_you`` event (``phasegate.store.commit.NEEDS_YOU_EVENT``)
— the commit path appends one, in the commit's own transaction, when a
workflow's status changes into a person's turn (``NEEDS_YOU_STATUSES``: waiting,
awaiting_approval, paused, planning_timeout) or into failed. So there is one
per transition, whichever process (a worker, ``phasegate run``, a person's
decision, the dashboard) committed it, never one per worker poll or retry:
a waiting workflow's polls and a decision that keeps it waiting change no status.

When: ``attach(engine)`` chains the Notifier into ``Engine.on_event``; after
each commit that leaves a workflow in such a status it delivers the
workflow's pending event there and then, still under the workflow's lease
(the lease is what keeps two processes from delivering the same event). A
front end that sets ``on_event`` after ``attach`` goes through
``set_on_event``, which keeps the notifier. ``Notifier.catch_up`` (a worker's
start) delivers what a process killed between a commit and its notification
left pending.

At most once: before a channel is tried a ``notified`` event
(``{"event": id, "status", "channels"}``) records the delivery, and an event
with such a record is never delivered again (a restart, a second notifier).
Only the latest pending event of a workflow still in that status is
delivered: an older one, or one the workflow has moved on from, is news no
more. A workflow paused only for its conflict child (phases/conflict.py) and
a conflict child itself are not a person's business. With no channel at all
nothing is recorded: a channel configured later catches the pending one up.

Channels: ``[notify] webhook`` (``NotifySettings``) gets a JSON POST within
``timeout_s``, tried again after 0.5 s, 1 s, … up to ``retries`` times on a
connection failure, a timeout, a 429 or a 5xx; a failure is logged and a
``notify_failed`` event written, never the workflow's failure. ``desktop``:
``notify-send`` when it is on PATH and ``DISPLAY`` or ``WAYLAND_DISPLAY`` is set.
No secret of the cartridge (``cartridge_secrets``) reaches a notification, a
log line or an event: the text is redacted, and the webhook URL (a secret
itself, often) is shown by its host only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phasegate.agents.env import cartridge_secrets
from phasegate.config.cartridge import Cartridge, NotifySettings
from phasegate.core.contract import EventWrite, PhasegateError
from phasegate.core.redaction import redact
from phasegate.proc.host import host_name
from phasegate.store import Store
from phasegate.store.commit import NEEDS_YOU_EVENT, NEEDS_YOU_EVENT_STATUSES

if TYPE_CHECKING:
    from phasegate.runtime.engine import Engine, EventCallback

__all__ = [
    "NOTIFIED_EVENT",
    "NOTIFY_FAILED_EVENT",
    "Notification",
    "Notifier",
    "attach",
    "catch_up",
    "set_on_event",
    "webhook_body",
]

log = logging.getLogger(__name__)

#: The event recording that a ``needs_you`` event was delivered (tried).
NOTIFIED_EVENT = "notified"
#: The event recording that a channel gave up on a delivery.
NOTIFY_FAILED_EVENT = "notify_failed"

#: Characters of a workflow's error a notification carries, and of its title.
_REASON_CHARS = 300
_TITLE_CHARS = 120

#: Seconds of the lease ``catch_up`` delivers under: a webhook's tries fit in it.
_CATCH_UP_LEASE_S = 120.0

#: Seconds a desktop notification may take (notify-send talks to a session bus).
_DESKTOP_TIMEOUT_S = 5.0

_WHAT = {
    "waiting": "waits for you: its report is ready; `phasegate approve-merge {id}` merges it, "
    "`phasegate feedback {id} TEXT` sends it back to development",
    "awaiting_approval": "has a proposal awaiting your decision: `phasegate approve` or "
    "`phasegate reject` (`phasegate show {id}` says which)",
    "paused": "is paused and waits for you: `phasegate resume {id}` when it may go on",
    "planning_timeout": "timed out in planning: `phasegate resume {id}` tries again",
    "failed": "failed: `phasegate show {id}` says why; `phasegate resume {id}` runs its "
    "phase again",
}


@dataclass(frozen=True)
class Notification:
    """One needs-you notification, redacted: ``title`` (one line) and ``text``."""

    workflow_id: str
    status: str
    event_id: int
    title: str
    text: str


def _message(
    row: Mapping[str, Any],
    event: Mapping[str, Any],
    secrets: Sequence[str],
    dashboard_url: str | None = None,
) -> tuple[str, str]:
    status = event["data"]["status"]
    what = _WHAT.get(status, f"is {status}").format(id=row["id"])
    text = f"Workflow {row['id']} ({row['title']}) {what}."
    # Redacted before it is cut: a secret cut in half would no longer be found.
    reason = redact((row.get("error") or "").strip(), secrets)
    if reason and row["status"] == status:
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 1] + "…"
        text += f"\nReason: {reason}"
    if dashboard_url:
        text += f"\n{dashboard_url.rstrip('/')}/workflows/{row['id']}"
    name = redact(" ".join(str(row["title"]).split()), secrets)
    if len(name) > _TITLE_CHARS:
        name = name[: _TITLE_CHARS - 1] + "…"
    return f"phasegate: {name}: {status.replace('_', ' ')}", redact(text, secrets)


def webhook_body(settings: NotifySettings, url: str, note: Notification) -> tuple[str, bytes]:
    """The URL to POST to and the JSON body, for ``settings.format``: "slack"
    ``{"text": …}`` to ``url``, escaped as Slack's mrkdwn needs (``&``, ``<``,
    ``>``: no title mentions a channel or disguises a link); "ntfy" a JSON publish
    (``{"topic", "title", "message"}``) to the server's root, the topic ``url``'s
    last path segment."""
    if settings.format == "ntfy":
        parts = urllib.parse.urlsplit(url)
        topic = parts.path.rstrip("/").rsplit("/", 1)[-1]
        root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
        body: dict[str, Any] = {"topic": topic, "title": note.title, "message": note.text}
        return root, json.dumps(body).encode()
    title, text = _slack_escaped(note.title), _slack_escaped(note.text)
    return url, json.dumps({"text": f"*{title}*\n{text}"}).encode()


def _slack_escaped(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``&``, ``<`` and ``>`` escaped.
    A ticket's title is anyone's words, and unescaped ``<!channel>`` would notify a
    whole channel, ``<https://…|label>`` show a link under another name."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _shown(url: str) -> str:
    """A webhook URL as logs and events may show it: its scheme and host only."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"


class Notifier:
    """Delivers a store's ``needs_you`` events over the cartridge's ``[notify]``
    channels (this module's docstring says which and when).

    ``environ`` (default ``os.environ``): where ``webhook_env``, the secrets
    and the display are read; ``retry_delays_s``: the waits (seconds) between
    a webhook's tries, the first ``retries`` of them used.
    """

    def __init__(
        self,
        store: Store,
        cartridge: Cartridge,
        *,
        environ: Mapping[str, str] | None = None,
        retry_delays_s: Sequence[float] = (0.5, 1.0, 2.0, 4.0, 8.0),
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.store = store
        self.settings = cartridge.notify
        self.environ = os.environ if environ is None else environ
        self.secrets = cartridge_secrets(cartridge, self.environ)
        self.retry_delays_s = tuple(retry_delays_s)[: self.settings.retries]
        self.webhook = self.settings.webhook or (
            self.environ.get(self.settings.webhook_env or "") or None
        )
        if self.webhook is not None:
            self.secrets.append(self.webhook)  # a Slack webhook URL is a credential
        self._which = which

    # -- when -------------------------------------------------------------------

    def on_event(self, workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        """``Engine.on_event``: after a commit leaving the workflow in a needs-you (or
        failed) status, deliver its pending notification. Never raises: a
        notification that could not go out is logged, and the workflow goes on."""
        if type_ != "committed" or data.get("status") not in NEEDS_YOU_EVENT_STATUSES:
            return
        try:
            self.deliver(workflow_id)
        except PhasegateError as exc:  # the store unavailable, among others
            log.warning("notification for %s not sent: %s", workflow_id, exc)
        except Exception:  # a notifier's fault must not undo the commit's caller
            log.exception("notification for %s not sent", workflow_id)

    def catch_up(
        self, *, repo_path: str | None = None, repository: str | None = None
    ) -> list[Notification]:
        """Deliver what is pending for every workflow in a needs-you (or failed) status
        (only a clone's, ``repo_path``, or a forge repository's, ``repository``,
        when either is given: a shared store holds other teams' workflows too),
        each under a lease of its own (skipped while another process holds it:
        its commit delivers). Returns what was delivered. Never raises: a store
        found unavailable is logged, and what is left goes at the next start."""
        delivered: list[Notification] = []
        # host:pid first, as a worker's: a process killed mid-catch-up frees it at once.
        owner = f"{host_name()}:{os.getpid()}:notify"
        try:
            for row in self.store.list_workflows(NEEDS_YOU_EVENT_STATUSES):
                if row["status"] not in NEEDS_YOU_EVENT_STATUSES:
                    continue
                if (repo_path or repository) and not (
                    row["repo_path"] == repo_path
                    or (repository is not None and row.get("repository") == repository)
                ):
                    continue
                if self.store.claim(row["id"], owner, _CATCH_UP_LEASE_S) is None:
                    continue
                try:
                    delivered += self.deliver(row["id"])
                finally:
                    self.store.release(row["id"], owner)
        except PhasegateError as exc:  # the store unavailable, among others
            log.warning("pending notifications not caught up: %s", exc)
        return delivered

    # -- what -------------------------------------------------------------------

    def pending(self, workflow_id: str) -> Notification | None:
        """The workflow's notification not yet delivered, if any (reads only): its
        latest ``needs_you`` event, while the workflow is still in that status and
        no ``notified`` event records it. Raises WorkflowNotFound, StoreUnavailable."""
        row = self.store.workflow_row(workflow_id)
        if row["status"] not in NEEDS_YOU_EVENT_STATUSES or row.get("parent_workflow_id"):
            return None
        if row["status"] == "paused" and (row.get("state") or {}).get("conflict_child"):
            return None  # its child resolves the conflict; the child's end wakes it
        # Only these two types: a workflow's history may hold a million output rows.
        events = self.store.events(workflow_id, types=(NEEDS_YOU_EVENT, NOTIFIED_EVENT))
        entered = [e for e in events if e["type"] == NEEDS_YOU_EVENT]
        if not entered or entered[-1]["data"].get("status") != row["status"]:
            return None
        latest = entered[-1]
        if any(
            e["type"] == NOTIFIED_EVENT and e["data"].get("event") == latest["id"]
            for e in events
            if e["id"] > latest["id"]
        ):
            return None
        title, text = _message(row, latest, self.secrets, self.settings.dashboard_url)
        return Notification(workflow_id, row["status"], latest["id"], title, text)

    def deliver(self, workflow_id: str) -> list[Notification]:
        """Record and send the workflow's pending notification (``pending``); the
        caller holds the workflow's lease. Returns what was sent (tried). A
        channel's failure is logged and recorded (``notify_failed``), never
        raised. Raises WorkflowNotFound, StoreUnavailable (nothing sent)."""
        channels = self._channels()
        if not channels:
            return []  # nothing to record: configured later, a start catches it up
        note = self.pending(workflow_id)
        if note is None:
            return []
        # Recorded before any channel is tried: a process killed mid-send never sends
        # it twice (at most once; a lost notification beats a flood).
        self.store.add_event(
            workflow_id,
            EventWrite(
                NOTIFIED_EVENT,
                {"event": note.event_id, "status": note.status, "channels": channels},
            ),
        )
        for channel in channels:
            failure = self._send_webhook(note) if channel == "webhook" else self._desktop(note)
            if failure is not None:
                self.store.add_event(
                    workflow_id,
                    EventWrite(
                        NOTIFY_FAILED_EVENT,
                        {"event": note.event_id, "channel": channel, "error": failure},
                    ),
                )
        return [note]

    # -- how --------------------------------------------------------------------

    def _channels(self) -> list[str]:
        channels = ["webhook"] if self.webhook else []
        if self.settings.desktop and self._desktop_available():
            channels.append("desktop")
        return channels

    def _desktop_available(self) -> bool:
        display = self.environ.get("DISPLAY") or self.environ.get("WAYLAND_DISPLAY")
        return bool(display) and self._which("notify-send") is not None

    def _send_webhook(self, note: Notification) -> str | None:
        """POST the notification; None once a try was accepted (2xx), else what the
        last try met (redacted, the URL by its host)."""
        assert self.webhook is not None
        url, body = webhook_body(self.settings, self.webhook, note)
        shown = _shown(self.webhook)
        failure: str | None = ""
        for attempt, delay in enumerate((*self.retry_delays_s, None)):
            failure, again = self._post(url, body)
            if failure is None:
                return None
            failure = redact(failure, self.secrets)
            if delay is None or not again:
                break
            log.warning(
                "notification webhook %s, try %d: %s; trying again in %.1f s",
                shown,
                attempt + 1,
                failure,
                delay,
            )
            time.sleep(delay)
        log.error("notification of %s to %s not sent: %s", note.workflow_id, shown, failure)
        return failure

    def _post(self, url: str, body: bytes) -> tuple[str | None, bool]:
        """One try: (None, _) when accepted, else (what failed, whether to try again)."""
        request = urllib.request.Request(
            url,
            data=body,
            headers={"Content-Type": "application/json", "User-Agent": "phasegate"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            return f"HTTP {exc.code}", exc.code == 429 or exc.code >= 500
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"{type(exc).__name__}: {reason}", True
        return None, False

    def _desktop(self, note: Notification) -> str | None:
        command = [self._which("notify-send") or "notify-send", "--app-name=phasegate"]
        try:
            done = subprocess.run(
                [*command, note.title, note.text],
                capture_output=True,
                text=True,
                timeout=_DESKTOP_TIMEOUT_S,
                env=dict(self.environ),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            failure = f"notify-send: {type(exc).__name__}: {exc}"
        else:
            if done.returncode == 0:
                return None
            failure = f"notify-send exited {done.returncode}: {done.stderr.strip()[:200]}"
        failure = redact(failure, self.secrets)
        log.warning("desktop notification of %s not shown: %s", note.workflow_id, failure)
        return failure


def catch_up(engine: Engine) -> list[Notification]:
    """``Notifier.catch_up`` for the engine's workflows (its clone's and its forge
    repository's), as a worker's start does: what a process killed between a
    commit and its notification left pending."""
    notifier = Notifier(engine.store, engine.cartridge)
    return notifier.catch_up(repo_path=str(engine.repo), repository=engine.repository)


def attach(engine: Engine, notifier: Notifier | None = None) -> Notifier:
    """Chain a Notifier (default: one for the engine's store and cartridge) after
    ``engine.on_event``, whatever that already did; returns it. Set the engine's
    on_event later through ``set_on_event``, which keeps the notifier."""
    notifier = notifier or Notifier(engine.store, engine.cartridge)
    _ATTACHED[engine] = notifier
    set_on_event(engine, engine.on_event)
    return notifier


def set_on_event(engine: Engine, callback: EventCallback | None) -> None:
    """Make ``callback`` the engine's ``on_event`` (progress display), followed by the
    notifier ``attach`` gave it, if any."""
    notifier = _ATTACHED.get(engine)
    if notifier is None:
        engine.on_event = callback
        return

    def on_event(workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        if callback is not None:
            callback(workflow_id, type_, data)
        notifier.on_event(workflow_id, type_, data)

    engine.on_event = on_event


#: The notifier each engine was given (``attach``), for ``set_on_event``.
_ATTACHED: weakref.WeakKeyDictionary[Engine, Notifier] = weakref.WeakKeyDictionary()
