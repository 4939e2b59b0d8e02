"""GitHub's official OpenAPI description cut to the operations phasegate uses.

Prism 5.16 starts on the whole ``api.github.com.json`` (13 MB) in 11-15 s
with 285 MB resident, on ``api.github.com.deref.json`` (73 MB) in 12.6 s with
517 MB; on the cut (25 operations then, 380 KB) in 1.6-2.4 s with 160 MB, where a
one-operation file takes 1.1-1.2 s. The cut is made from the ``.json`` (its
references kept): the same cut of the ``.deref.json`` is 1.4 MB and starts no
faster. ``scripts/cut_openapi.py`` writes the cut from the command line;
``support.prism`` makes it once per description and serves it
through Prism.

The standard library only: ``scripts/cut_openapi.py`` loads this file by path,
so the cut works from a clean clone before phasegate is installed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["OPERATIONS", "cut_description", "cut_file"]

#: The GitHub REST operations phasegate uses, as
#: ``(METHOD, path template)`` exactly as GitHub's description spells them.
OPERATIONS: tuple[tuple[str, str], ...] = (
    ("GET", "/repos/{owner}/{repo}"),
    ("POST", "/user/repos"),
    ("POST", "/orgs/{org}/repos"),
    ("GET", "/user"),
    ("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission"),
    ("GET", "/repos/{owner}/{repo}/issues"),
    ("POST", "/repos/{owner}/{repo}/issues"),
    ("GET", "/repos/{owner}/{repo}/issues/{issue_number}"),
    ("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}"),
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/sub_issues"),
    ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/parent"),
    ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/events"),
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels"),
    ("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}"),
    ("GET", "/repos/{owner}/{repo}/labels"),
    ("POST", "/repos/{owner}/{repo}/labels"),
    ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"),
    ("GET", "/repos/{owner}/{repo}/pulls"),
    ("POST", "/repos/{owner}/{repo}/pulls"),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}"),
    ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"),
    ("PUT", "/repos/{owner}/{repo}/pulls/{pull_number}/merge"),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/comments"),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs"),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}/status"),
    ("POST", "/repos/{owner}/{repo}/statuses/{sha}"),
    ("GET", "/repos/{owner}/{repo}/branches/{branch}"),
    ("DELETE", "/repos/{owner}/{repo}/git/refs/{ref}"),
    ("GET", "/repos/{owner}/{repo}/installation"),
    ("POST", "/app/installations/{installation_id}/access_tokens"),
)
_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def cut_description(
    source: Mapping[str, Any],
    operations: Iterable[tuple[str, str]] = OPERATIONS,
) -> dict[str, Any]:
    """GitHub's OpenAPI description cut to ``operations``.

    ``source`` is the parsed ``api.github.com.json`` (OpenAPI 3.0, internal
    ``#/components/...`` references). The result keeps the document's header
    (openapi, info, servers, externalDocs), only the listed operations (and
    path-level fields of their paths), and every component they reference,
    transitively; webhooks and unused tags are dropped. Raises ``KeyError``
    naming an operation the description does not have, ``ValueError`` for a
    reference that is not an internal component.
    """
    paths: dict[str, dict[str, Any]] = {}
    for method, template in operations:
        item = source["paths"].get(template, {})
        if method.lower() not in item:
            raise KeyError(f"GitHub's description has no operation {method} {template}")
        kept = paths.setdefault(template, {k: v for k, v in item.items() if k not in _HTTP_METHODS})
        kept[method.lower()] = item[method.lower()]

    components: dict[str, dict[str, Any]] = {}
    pending = list(_refs(paths))
    while pending:
        kind, name = pending.pop()
        if name in components.get(kind, {}):
            continue
        try:
            target = source["components"][kind][name]
        except KeyError:
            raise ValueError(f"dangling reference #/components/{kind}/{name}") from None
        components.setdefault(kind, {})[name] = target
        pending.extend(_refs(target))

    used_tags = {t for item in paths.values() for op in _ops(item) for t in op.get("tags", ())}
    cut: dict[str, Any] = {
        k: source[k] for k in ("openapi", "info", "servers", "externalDocs") if k in source
    }
    cut["tags"] = [t for t in source.get("tags", ()) if t.get("name") in used_tags]
    cut["paths"] = paths
    cut["components"] = {kind: dict(sorted(v.items())) for kind, v in sorted(components.items())}
    return _nullable_without_type(cut)


def _nullable_without_type(node: Any) -> Any:
    """``node`` with every ``nullable`` beside no ``type`` spelled out for Prism.

    GitHub's description says ``{"nullable": true, "anyOf": [...]}`` (an
    issue's ``performed_via_github_app``, a field value, a milestone number):
    Prism's Ajv refuses to compile any schema holding that (``"nullable"
    cannot be used without "type"``) and Prism then takes the whole body as
    valid without a word: 101 of the 7,039 schemas of the whole description,
    7 of the cut's 220 (issue create, get, update and list, and the
    installation), referee nothing. Such a schema
    becomes ``{"anyOf": [<it without nullable>, {"type": "null"}]}`` (what
    GitHub means: it does send null there), a ``nullable: false`` without a
    type is dropped. Examples and ``x-`` extensions are data, left as they are.
    """
    if isinstance(node, list):
        return [_nullable_without_type(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: v if k in ("example", "examples") or k.startswith("x-") else _nullable_without_type(v)
        for k, v in node.items()
    }
    if "nullable" in out and "type" not in out and not isinstance(out["nullable"], dict):
        nullable = out.pop("nullable")
        if nullable is True:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _ops(item: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (v for k, v in item.items() if k in _HTTP_METHODS)


def _refs(node: Any) -> Iterable[tuple[str, str]]:
    """Every ``(kind, name)`` of a ``#/components/<kind>/<name>`` reference in ``node``."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            ref = current.get("$ref")
            if isinstance(ref, str):
                parts = ref.split("/")
                if len(parts) != 4 or parts[:2] != ["#", "components"]:
                    raise ValueError(f"not an internal component reference: {ref}")
                # JSON pointer escapes (RFC 6901): ~1 is '/', ~0 is '~'.
                yield parts[2], parts[3].replace("~1", "/").replace("~0", "~")
            stack.extend(v for k, v in current.items() if k != "$ref")
        elif isinstance(current, list):
            stack.extend(current)


def cut_file(source: Path, dest: Path, operations: Iterable[tuple[str, str]] = OPERATIONS) -> None:
    """Read GitHub's description at ``source``, write its cut (``cut_description``)
    to ``dest`` atomically (a reader never sees half a file)."""
    cut = cut_description(json.loads(source.read_bytes()), operations)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(cut, out, separators=(",", ":"))
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
