"""GitLab's official OpenAPI description cut to the operations phasegate's GitLab forge uses.

The source is GitLab's own ``doc/api/openapi/openapi_v3.yaml`` (OpenAPI
3.0, generated from the Grape API by ``bin/rake gitlab:openapi:v3:generate``;
licence CC BY-SA 4.0), in the repository gitlab-org/gitlab, mirrored on
GitHub as gitlabhq/gitlabhq:
https://github.com/gitlabhq/gitlabhq/blob/master/doc/api/openapi/openapi_v3.yaml
(version 19.5 at commit 045bf8777ea893e770b49d420febaeb7bf89e24a, 3.9 MB).
No npm or PyPI package ships it, and CI reaches nothing else, so the cut is
made once on a machine that has the file (``scripts/cut_gitlab_openapi.py
SRC DEST --source-url U --commit C``) and committed as ``CUT_PATH``; the
source and commit go into the cut's ``info.x-phasegate-cut``.

``OPERATIONS`` are spelled as that file spells its paths: the ``/api/v4``
prefix is part of each path, a project is ``{id}`` (an id or the URL-encoded
path), issue and merge request numbers are ``{issue_iid}`` and
``{merge_request_iid}``, and the notes and discussions routes, which Grape
shares between noteables, name the number ``{noteable_id}``. Whatever the
file lacks is listed by ``missing()`` and written into the cut's header;
those operations are checked against python-gitlab's objects instead.

Two things of the generated file are put right (``corrected``): a list
endpoint documented as answering one object (the project's labels say
``$ref: APIEntitiesProjectLabel`` where GitLab answers an array) gets an
array of it, as ``LISTS`` names; and ``nullable`` beside no ``type`` is
spelled out for Prism as github_openapi.py does for GitHub's description.

The standard library only, but for reading the YAML source (PyYAML, in
phasegate's test environment); a JSON source needs nothing more.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from support.github_openapi import cut_description as cut_github_style

__all__ = [
    "CUT_PATH",
    "LISTS",
    "OPERATIONS",
    "SOURCE_URL",
    "corrected",
    "cut_description",
    "cut_file",
    "load",
    "missing",
]

SOURCE_URL = "https://github.com/gitlabhq/gitlabhq/blob/master/doc/api/openapi/openapi_v3.yaml"
#: Where the committed cut lives.
CUT_PATH = Path(__file__).resolve().parents[1] / "data" / "gitlab-openapi-cut.json"

_P = "/api/v4/projects/{id}"
_MR = _P + "/merge_requests/{merge_request_iid}"
#: The GitLab REST operations phasegate's GitLab forge uses, as the source spells them.
OPERATIONS: tuple[tuple[str, str], ...] = (
    ("GET", "/api/v4/user"),
    ("GET", _P),
    ("GET", _P + "/members/all/{user_id}"),
    ("GET", _P + "/labels"),
    ("POST", _P + "/labels"),
    ("GET", _P + "/issues"),
    ("POST", _P + "/issues"),
    ("GET", _P + "/issues/{issue_iid}"),
    ("PUT", _P + "/issues/{issue_iid}"),
    ("GET", _P + "/issues/{noteable_id}/notes"),
    ("POST", _P + "/issues/{noteable_id}/notes"),
    ("GET", _P + "/merge_requests"),
    ("POST", _P + "/merge_requests"),
    ("GET", _MR),
    ("PUT", _MR),
    ("PUT", _MR + "/merge"),
    ("GET", _P + "/merge_requests/{noteable_id}/notes"),
    ("POST", _P + "/merge_requests/{noteable_id}/notes"),
    ("GET", _P + "/merge_requests/{noteable_id}/discussions"),
    ("GET", _P + "/repository/commits/{sha}/statuses"),
    ("POST", _P + "/statuses/{sha}"),
    ("GET", _P + "/pipelines"),
    ("DELETE", _P + "/repository/branches/{branch}"),
)
#: The operations that answer an array, whatever the source says of them.
LISTS: frozenset[tuple[str, str]] = frozenset(
    (m, p)
    for m, p in OPERATIONS
    if m == "GET"
    and p.endswith(
        (
            "/labels",
            "/issues",
            "/notes",
            "/merge_requests",
            "/discussions",
            "/statuses",
            "/pipelines",
        )
    )
)


def load(source: Path) -> dict[str, Any]:
    """The description at ``source``: JSON, or YAML (PyYAML's C loader when there)."""
    text = source.read_bytes()
    if source.suffix == ".json":
        return json.loads(text)
    import yaml  # only the YAML source needs it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loaded: dict[str, Any] = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    return loaded


def missing(
    source: Mapping[str, Any], operations: Iterable[tuple[str, str]] = OPERATIONS
) -> list[tuple[str, str]]:
    """The ``operations`` the description does not have."""
    paths = source.get("paths", {})
    return [(m, p) for m, p in operations if m.lower() not in paths.get(p, {})]


def corrected(cut: dict[str, Any], lists: Iterable[tuple[str, str]] = LISTS) -> dict[str, Any]:
    """``cut`` with each of ``lists``' 200 answers an array (see the module docstring)."""
    cut = copy.deepcopy(cut)
    for method, path in lists:
        operation = cut["paths"].get(path, {}).get(method.lower())
        if operation is None:
            continue
        for media in operation.get("responses", {}).get("200", {}).get("content", {}).values():
            schema = media.get("schema", {})
            if schema.get("type") != "array":
                media["schema"] = {"type": "array", "items": schema}
    return cut


def cut_description(
    source: Mapping[str, Any],
    operations: Iterable[tuple[str, str]] = OPERATIONS,
    *,
    provenance: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """GitLab's description cut to those of ``operations`` it has, corrected,
    its header (``info.x-phasegate-cut``) naming ``provenance`` and what it lacks."""
    wanted = list(operations)
    absent = missing(source, wanted)
    present = [op for op in wanted if op not in absent]
    cut = corrected(cut_github_style(source, present))
    info = dict(cut.get("info", {}))
    info["x-phasegate-cut"] = {
        **dict(provenance or {}),
        "operations": [f"{m} {p}" for m, p in present],
        "missing": [f"{m} {p}" for m, p in absent],
    }
    cut["info"] = info
    return cut


def cut_file(
    source: Path,
    dest: Path,
    operations: Iterable[tuple[str, str]] = OPERATIONS,
    *,
    provenance: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Read the description at ``source``, write its cut to ``dest`` atomically
    (indented: the committed cut is read in reviews); the cut."""
    cut = cut_description(load(source), operations, provenance=provenance)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(cut, out, indent=1, sort_keys=False)
        out.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return cut
