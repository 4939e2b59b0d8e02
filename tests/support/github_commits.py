"""A commit as GitHub's REST API and its webhooks show it (the ``commit`` schema)."""

from __future__ import annotations

from typing import Any

from support.github_model import Repo

__all__ = ["commit_shape", "reactions"]


def commit_shape(api: str, r: Repo, sha: str) -> dict[str, Any]:
    """``commit`` of ``sha`` in ``r``, read from its bare repository, for a server
    answering at ``api``. GitHub accounts are not matched to the commit's
    author: ``author`` and ``committer`` are null, as for an unknown email."""
    fields = r.git.git(
        "show", "-s", "--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%T%x00%P%x00%B", sha
    ).split("\x00")
    an, ae, ad, cn, ce, cd, tree, parents, message = fields
    base = f"{api}/repos/{r.full_name}"
    return {
        "url": f"{base}/commits/{sha}",
        "sha": sha,
        "node_id": f"C_{sha[:20]}",
        "html_url": f"{api}/{r.full_name}/commit/{sha}",
        "comments_url": f"{base}/commits/{sha}/comments",
        "commit": {
            "url": f"{base}/git/commits/{sha}",
            "author": {"name": an, "email": ae, "date": ad},
            "committer": {"name": cn, "email": ce, "date": cd},
            "message": message.rstrip("\n"),
            "comment_count": 0,
            "verification": {
                "verified": False,
                "reason": "unsigned",
                "signature": None,
                "payload": None,
                "verified_at": None,
            },
            "tree": {"sha": tree, "url": f"{base}/git/trees/{tree}"},
        },
        "author": None,
        "committer": None,
        "parents": [
            {"sha": p, "url": f"{base}/commits/{p}", "html_url": f"{api}/{r.full_name}/commit/{p}"}
            for p in parents.split()
        ],
    }


def reactions(url: str) -> dict[str, Any]:
    """The ``reactions`` of an issue or comment at ``url``: none (the fake has no
    reactions), as webhooks always carry them."""
    counts = dict.fromkeys(
        ("+1", "-1", "laugh", "confused", "heart", "hooray", "eyes", "rocket"), 0
    )
    return {"url": f"{url}/reactions", "total_count": 0, **counts}
