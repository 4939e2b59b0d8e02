"""The fake GitHub's webhooks: what happens on a repository, delivered as GitHub delivers it.

A repository's hooks (repos/create-webhook over REST, or ``add`` from a test)
each get a POST per event they subscribe to: GitHub's headers
(``X-GitHub-Event``, ``X-GitHub-Delivery``, ``X-GitHub-Hook-ID``,
``X-Hub-Signature-256`` — the body's HMAC-SHA256 with the hook's secret,
``sha256=<hex>`` — and a ``GitHub-Hookshot`` user agent), a JSON body of the
event's action, its objects in the REST API's shapes, the repository and the
sender. The model announces an event under its lock (``GitHub.announce``);
the payload is rendered then, and sent from a thread of its own, so a
receiver that calls the API back does not wait on the lock.

Events: ``issue_comment`` (created), ``issues`` (labeled), ``pull_request``
(closed), ``pull_request_review`` (submitted), ``check_run`` (created,
completed) and ``status``. Each delivery is kept (``delivered``) with the
status the receiver answered; ``redeliver`` sends one again as it was;
``payload_problems`` judges a payload by GitHub's own webhook schemas.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from support.fake_hooks import DELIVERY_TIMEOUT_S, Deliveries
from support.github_json import Shapes
from support.github_model import GitHubError, Repo, User, invalid
from support.github_routes import Call, route

if TYPE_CHECKING:
    from support.github_server import GitHubServer

__all__ = ["Delivered", "Hook", "HookDeliveries", "payload_problems"]


@dataclass
class Hook:
    id: int
    repo: str  # full name
    url: str
    secret: str
    events: frozenset[str]  # "*": every event
    active: bool = True


@dataclass
class Delivered:
    """One delivery: what was sent, and the receiver's answer (None: none came)."""

    guid: str
    hook: Hook
    event: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    answer: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class HookDeliveries(Deliveries[Hook, Delivered]):
    """The hooks of every repository of ``server`` and what was delivered to them."""

    def __init__(self, server: GitHubServer) -> None:
        super().__init__("fake-github-hooks")
        self.server = server

    def add(self, repo: str, url: str, secret: str, events: tuple[str, ...] = ("*",)) -> Hook:
        """A hook on ``repo`` posting ``events`` to ``url``, signed with ``secret``."""
        with self.server.lock:
            full_name = self.server.repo(repo).full_name
            hook = Hook(self.next_id(), full_name, url, secret, frozenset(events))
            self.hooks.append(hook)
            return hook

    def announce(
        self, r: Repo, event: str, sender: User, render: Callable[[Shapes], dict[str, Any]]
    ) -> None:
        """Queue ``event`` on ``r`` for every active hook of ``r`` that subscribes to
        it; ``render`` gives its action and objects. Called under the model's lock."""
        hooks = [h for h in self.hooks if h.repo == r.full_name and h.active]
        hooks = [h for h in hooks if "*" in h.events or event in h.events]
        if not hooks:
            return
        shapes = self.server.shapes
        whole = {**render(shapes), "repository": shapes.repo(r), "sender": shapes.user(sender)}
        body = json.dumps(whole).encode()
        for hook in hooks:
            guid = str(uuid.uuid4())
            signature = hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "GitHub-Hookshot/fake",
                "X-GitHub-Event": event,
                "X-GitHub-Delivery": guid,
                "X-GitHub-Hook-ID": str(hook.id),
                "X-GitHub-Hook-Installation-Target-Type": "repository",
                "X-GitHub-Hook-Installation-Target-ID": str(r.id),
                "X-Hub-Signature-256": f"sha256={signature}",
            }
            self.send(Delivered(guid, hook, event, headers, body))

    def redeliver(self, delivered: Delivered) -> Delivered:
        """Send ``delivered`` again, headers and body as they were; the new delivery."""
        again = Delivered(delivered.guid, delivered.hook, delivered.event,
                          dict(delivered.headers), delivered.body)  # fmt: skip
        self.send(again)
        again.done.wait(DELIVERY_TIMEOUT_S + 1)
        return again


# -- webhooks over REST (repos/create-webhook): what a repository's admin sets up --
@route("POST", "/repos/{owner}/{repo}/hooks")
def create_hook(call: Call) -> Any:
    r = call.repo("admin")
    config = call.field("config")
    if not isinstance(config, dict) or not config.get("url"):
        raise invalid("Hook", "url", "missing_field")
    if config.get("content_type", "form") != "json":
        raise GitHubError(422, "The fake delivers JSON only: set config.content_type to json")
    events = call.field("events") or ["push"]
    hook = call.gh.hooks.add(
        r.full_name, str(config["url"]), str(config.get("secret") or ""), tuple(events)
    )
    hook.active = bool(call.field("active", True))
    base = f"{call.gh.url}/repos/{r.full_name}/hooks/{hook.id}"
    call.created(base)
    stamp = "2026-01-01T00:00:00Z"
    return {
        "type": "Repository",
        "id": hook.id,
        "name": "web",
        "active": hook.active,
        "events": sorted(hook.events),
        "config": {"url": hook.url, "content_type": "json", "insecure_ssl": "0"},
        "updated_at": stamp,
        "created_at": stamp,
        "url": base,
        "test_url": f"{base}/test",
        "ping_url": f"{base}/pings",
        "deliveries_url": f"{base}/deliveries",
        "last_response": {"code": None, "status": "unused", "message": None},
    }


@functools.cache
def _webhook_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """GitHub's description's ``x-webhooks`` and its components, OpenAPI 3.0's
    ``nullable`` turned into JSON Schema's ``null`` type."""
    from support.prism import DEFAULT_SOURCE

    description = json.loads(DEFAULT_SOURCE.read_text())
    return description["x-webhooks"], _json_schema(description["components"])


def _json_schema(node: Any) -> Any:
    if isinstance(node, dict):
        converted = {
            k: _json_schema(v) for k, v in node.items() if k not in ("nullable", "example")
        }
        return {"anyOf": [converted, {"type": "null"}]} if node.get("nullable") else converted
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    return node


def payload_problems(delivered: Delivered) -> list[str]:
    """What GitHub's own webhook schema for ``delivered``'s event and action finds
    wrong in its payload (``x-webhooks`` of the REST description ``.ci/run``
    installs): [] when it is a payload GitHub could have sent."""
    import jsonschema

    hooks, components = _webhook_schemas()
    payload = json.loads(delivered.body)
    name = delivered.event.replace("_", "-")
    name += f"-{payload['action']}" if "action" in payload else ""
    body = hooks[name]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft7Validator({**body, "components": components})
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
        for e in validator.iter_errors(payload)
    ]
