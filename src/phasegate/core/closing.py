"""Closing keywords before an issue reference, defused so that no forge closes an
issue on a text or a commit phasegate writes.

    defuse_closing("Add square() closes #2")          # "Add square() Part of #2"
    defuse_closing("Fixes #3", replacement="Implements")

GitHub, GitLab and Gitea each close an issue when a commit reaching the default
branch, or a merged pull request's text, holds such a keyword before its
reference; phasegate closes an issue itself, after verification, and only its
own. The words are the union of the three forges' lists: close(s|d), closing,
fix(es|ed|ing), resolve(s|d), resolving, and GitLab's implement(s|ed|ing), in
any case, an optional colon after them. A reference is ``#N``, ``owner/repo#N``,
GitLab's ``group/sub/proj#N`` (``issue #N`` too), or an issue's URL.
"""

from __future__ import annotations

import re

__all__ = ["defuse_closing"]

_CLOSING = re.compile(
    r"\b(?:clos(?:e[sd]?|ing)|fix(?:e[sd]|ing)?|resolv(?:e[sd]?|ing)|implement(?:s|ed|ing)?)"
    r"(?=\s*:?\s*(?:issues?\s+)?(?:[\w./-]+)?#\d|\s*:?\s*(?:issues?\s+)?https?://\S+/issues/\d)",
    re.IGNORECASE,
)


def defuse_closing(text: str, replacement: str = "Part of") -> str:
    """``text`` with every closing keyword before an issue reference replaced by
    ``replacement``. ``Part of`` (the default) closes nothing on any forge;
    ``Implements`` closes nothing on GitHub or Gitea but does on GitLab, so a text
    that may reach GitLab (a commit message) keeps the default."""
    return _CLOSING.sub(replacement, text)
