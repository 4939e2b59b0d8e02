"""How phasegate numbers GitLab's merge requests apart from its issues.

GitLab counts issues (``#3``) and merge requests (``!3``) each from 1 in a
project, so ``#3`` and ``!3`` live side by side; phasegate's store,
its comments and its commands know one number per thing, as on GitHub, where
both share one sequence. The GitLab forge therefore gives merge request ``!N``
the number ``MR_NUMBERS + N`` (``!3`` is 1000003) and every number below
MR_NUMBERS is an issue. A merge request's own calls (``pull_request`` and the
rest) also take the plain ``N`` a person types. Texts sent to GitLab say
``!N`` for ``#1000000+N`` (``gitlab_references``), so GitLab links them.

No python-gitlab here: the webhook receiver reads these numbers without it.
"""

from __future__ import annotations

import re

__all__ = ["MR_NUMBERS", "gitlab_references", "is_merge_request", "mr_iid", "pull_number"]

#: Merge request ``!N`` is phasegate's number MR_NUMBERS + N.
MR_NUMBERS = 1_000_000

_REFERENCE = re.compile(r"(?<![\w&])#(\d{7,})\b")


def pull_number(iid: int) -> int:
    """phasegate's number of merge request ``!iid``."""
    return MR_NUMBERS + int(iid)


def is_merge_request(number: int) -> bool:
    """Whether phasegate's ``number`` names a merge request (else an issue)."""
    return number > MR_NUMBERS


def mr_iid(number: int) -> int:
    """The merge request's own ``iid`` for phasegate's ``number``, or for the plain
    iid a person typed."""
    return number - MR_NUMBERS if number > MR_NUMBERS else number


def gitlab_references(text: str) -> str:
    """``text`` with each ``#1000003`` (a merge request's number here) as ``!3``."""

    def shown(found: re.Match[str]) -> str:
        number = int(found.group(1))
        return f"!{mr_iid(number)}" if is_merge_request(number) else found.group(0)

    return _REFERENCE.sub(shown, text)
