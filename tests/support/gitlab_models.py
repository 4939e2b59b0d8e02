"""Every request sent to the fake GitLab, judged by python-gitlab's own description of GitLab's API.

GitLab's OpenAPI description ships in no package, so the judge is
python-gitlab: each manager of ``gitlab.v4.objects`` names its path
(``_path``), what a create takes (``_create_attrs``: required and optional
keys), what an update takes (``_update_attrs``) and the filters a list takes
(``_list_filters``). ``problems(recorded)`` maps a request's method and path
to the manager whose path matches — ``GET`` and ``POST`` on the collection
are list and create, ``GET``, ``PUT`` and ``DELETE`` on one item are get,
update and delete — and says what is wrong with it: a required key missing, a
key the manager does not know, a list filter it does not take (checked where
the manager lists its filters), or no manager at all.

What python-gitlab does not model as a manager, and how it is judged here:

- ``PUT /projects/:id/merge_requests/:iid/merge`` (``ProjectMergeRequest.merge``,
  a method): its body may hold ``MERGE_KEYS`` only, GitLab's documented
  parameters of "Merge a merge request";
- ``POST /projects/:id/statuses/:sha`` (``ProjectCommitStatusManager.create``
  posts there, not to its ``_path``): judged by that manager's ``_create_attrs``;
- ``add_labels`` and ``remove_labels`` on ``PUT /projects/:id/issues/:iid``:
  GitLab takes them (they add or remove labels without a read-modify-write
  race) but python-gitlab's ``_update_attrs`` lists only ``labels``
  (``EXTRA_UPDATE_KEYS``);
- git's smart HTTP (``/GROUP/NAME.git/...``): no REST, not judged.
"""

from __future__ import annotations

import inspect
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import gitlab.v4.objects as objects
from gitlab.base import RESTManager
from gitlab.mixins import CreateMixin, DeleteMixin, GetMixin, ListMixin, UpdateMixin

__all__ = ["EXTRA_UPDATE_KEYS", "MERGE_KEYS", "Judged", "judge", "problems"]

API = "/api/v4"
#: GitLab's parameters of ``PUT .../merge_requests/:iid/merge``.
MERGE_KEYS = frozenset({
    "merge_commit_message", "squash_commit_message", "squash", "should_remove_source_branch",
    "merge_when_pipeline_succeeds", "auto_merge", "sha",
})  # fmt: skip
#: Keys GitLab takes on an update that python-gitlab's ``_update_attrs`` lacks.
EXTRA_UPDATE_KEYS = {"ProjectIssueManager": frozenset({"add_labels", "remove_labels"})}
#: Query parameters every list takes (pagination), whatever its filters.
_PAGING = frozenset({"page", "per_page", "pagination", "order_by", "sort", "get_all"})
_STATUS_CREATE = re.compile(rf"^{API}/projects/[^/]+/statuses/[0-9a-f]+$")
_MERGE = re.compile(rf"^{API}/projects/[^/]+/merge_requests/\d+/merge$")


@dataclass(frozen=True)
class Judged:
    """A manager and the operation a request is on it (list, create, get, update, delete)."""

    manager: type[RESTManager[Any]]
    operation: str


def _pattern(template: str, item: bool) -> re.Pattern[str]:
    path = re.sub(r"\{[^}]+\}", "[^/]+", template)
    # a branch's name may hold slashes (the fake records the path decoded)
    last = "/.+$" if template.endswith("/repository/branches") else "/[^/]+$"
    return re.compile(f"^{API}{path}" + (last if item else "$"))


def _managers() -> list[type[RESTManager[Any]]]:
    found = [
        c for _, c in inspect.getmembers(objects, inspect.isclass)
        if issubclass(c, RESTManager) and isinstance(getattr(c, "_path", None), str)
    ]  # fmt: skip
    # the longest path first: /projects/:id/issues/:iid/notes before /projects/:id/issues
    return sorted(found, key=lambda c: -len(c._path))


_MANAGERS = _managers()
_COLLECTIONS = [(m, _pattern(m._path, item=False)) for m in _MANAGERS]
_ITEMS = [(m, _pattern(m._path, item=True)) for m in _MANAGERS]
_OPERATIONS = {
    ("GET", False): ("list", ListMixin), ("POST", False): ("create", CreateMixin),
    ("GET", True): ("get", GetMixin), ("PUT", True): ("update", UpdateMixin),
    ("DELETE", True): ("delete", DeleteMixin),
}  # fmt: skip


def judge(method: str, path: str) -> Judged | None:
    """The manager and operation ``method path`` is, or None when none has it."""
    if _STATUS_CREATE.match(path) and method == "POST":
        return Judged(objects.ProjectCommitStatusManager, "create")
    if path == f"{API}/user" and method == "GET":
        return Judged(objects.CurrentUserManager, "get")
    for item, table in ((False, _COLLECTIONS), (True, _ITEMS)):
        wanted = _OPERATIONS.get((method, item))
        if wanted is None:
            continue
        for manager, pattern in table:
            if pattern.match(path) and issubclass(manager, wanted[1]):
                return Judged(manager, wanted[0])
    return None


def problems(method: str, path: str, query: str, body: Any) -> list[str]:
    """What is wrong with one request by python-gitlab's managers ([] when nothing)."""
    if not path.startswith(API + "/"):
        return []  # git over HTTP
    said = f"{method} {path}"
    asked = {k for k, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    sent = set(body or {}) - asked  # the fake records query and body together
    if method == "PUT" and _MERGE.match(path):
        unknown = sorted(sent - MERGE_KEYS)
        return [f"{said}: the merge takes no {unknown}"] if unknown else []
    judged = judge(method, path)
    if judged is None:
        return [f"{said}: no python-gitlab manager has this operation"]
    manager, found = judged.manager, []
    if judged.operation in ("create", "update"):
        attrs = manager._create_attrs if judged.operation == "create" else manager._update_attrs
        known = {*attrs.required, *attrs.optional, *attrs.exclusive}
        known |= EXTRA_UPDATE_KEYS.get(manager.__name__, frozenset())
        missing = sorted(set(attrs.required) - sent)
        unknown = sorted(sent - known)
        if missing:
            found.append(f"{said}: {manager.__name__} requires {missing}")
        if unknown:
            found.append(f"{said}: {manager.__name__} takes no {unknown}")
    if judged.operation == "list":
        filters = set(getattr(manager, "_list_filters", ()) or ())
        unknown = sorted(asked - filters - _PAGING)
        if filters and unknown:
            found.append(f"{said}: {manager.__name__} lists by no {unknown}")
    return found


def all_problems(recorded: Iterable[Any]) -> list[str]:
    """Every problem of every request the fake recorded (its ``requests``). One a
    planned fault answered (a 429 or 5xx with no body recorded) never reached a
    handler, so what it carried is unknown: its path is judged, not its body."""
    found = []
    for r in recorded:
        faulted = r.body is None and (r.status == 429 or r.status >= 500)
        if faulted and r.method in ("POST", "PUT"):
            found += [p for p in problems(r.method, r.path, "", None) if "requires" not in p]
        else:
            found += problems(r.method, r.path, r.query, r.body)
    return found


__all__ += ["all_problems"]
