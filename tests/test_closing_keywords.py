"""Closing keywords defused: ``defuse_closing`` over GitHub's, GitLab's and Gitea's
words and references, and a workflow on the fake GitLab whose issue title says
``closes #N`` merging with no commit on main that would close an issue."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from phasegate.core.closing import defuse_closing
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from gitlab_forge_kit import TEAM, gitlab, team_project
from support.gitlab_lab import Lab

__all__ = ["gitlab"]  # a fixture, used by name

Build = Callable[..., tuple[Engine, Store]]

# What any of the three forges reads as closing: a word, an optional colon, a reference.
CLOSES = re.compile(
    r"\b(?:close[sd]?|closing|fix(?:e[sd]|ing)?|resolve[sd]?|resolving|implement(?:s|ed|ing)?)"
    r"\s*:?\s*(?:issues?\s+)?(?:[\w./-]+#\d|#\d|https?://\S+/issues/\d)",
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    ("text", "defused"),
    [
        ("Add square() closes #2", "Add square() Part of #2"),
        ("Fixes: #3 and RESOLVED o/r#4", "Part of: #3 and Part of o/r#4"),
        ("implementing group/sub/proj#5", "Part of group/sub/proj#5"),
        ("Closed issue #6", "Part of issue #6"),
        ("fixed https://gitlab.example.com/g/p/-/issues/7", "Part of https://gitlab.example.com/g/p/-/issues/7"),
        ("Resolving https://github.com/o/r/issues/8.", "Part of https://github.com/o/r/issues/8."),
        ("closes#9", "Part of#9"),
    ],
)  # fmt: skip
def test_every_forges_closing_word_before_a_reference_is_defused(text: str, defused: str) -> None:
    assert defuse_closing(text) == defused
    assert not CLOSES.search(defused)


def test_words_without_a_reference_and_other_words_are_left_alone() -> None:
    for text in ("fixes bugs", "enclosed #1", "prefix #2", "closes the door", "Part of #3"):
        assert defuse_closing(text) == text
    assert defuse_closing("Fix #1", replacement="Implements") == "Implements #1"


def test_a_title_saying_closes_merges_with_no_closing_commit_on_main(
    gitlab: Lab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_project(gitlab, tmp_path, auto_merge=False)
    gl = gitlab.gl
    project = gl.project(TEAM)
    other = gl.open_issue(TEAM, "dev", "Someone else's bug", "Leave it open.")
    title = f"Add the feature, closes #{other.iid} and Fixes: acme/widgets#{other.iid}"
    engine, _ = engine_for(repo)
    workflow_id = engine.start(title, "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    mr = project.merge_requests[1]
    gl.comment(mr, gl.users["dev"], "/phasegate merge")
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    messages = project.bare.git("log", "--format=%B%x00", "main").split("\0")
    assert any("Add the feature" in m for m in messages)
    said = [m for m in messages if CLOSES.search(m)]
    assert said == [], said
    assert other.state == "opened"
