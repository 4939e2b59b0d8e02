"""A workflow's diff on its page and a review of it: each
comment on a line is a draft that moves nothing; sent, the drafts are one
feedback naming each path and line, and the next build prompt carries it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from phasegate import operations
from phasegate.core import review
from phasegate.core.contract import PhasegateError
from phasegate.core.redaction import redact
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.auth import CSRF_HEADER
from phasegate.web.diff import files_as_dicts, parse_diff

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge

TOKEN = "web-token-for-diff-tests-0123456789"


@pytest.fixture
def diffed(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> Iterator[tuple[TestClient, Engine, Store, Path]]:
    """A dashboard whose build agent keeps each prompt and adds a line every round."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    build = (
        'runner = "command"\n'
        f"command = 'cat > {prompts}/build-$PHASEGATE_CALL_INDEX.txt; "
        'echo "round $PHASEGATE_CALL_INDEX" >> feature.txt; echo built\'\n'
        "timeout = 30\n"
    )
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    cartridge = scripted_cartridge(auto_merge=False, role_overrides={"build": build})
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, store = engine_for(repo)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        yield client, engine, store, prompts


def _csrf(client: TestClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(f"/login?token={TOKEN}").text)
    assert found
    return found.group(1)


def _drafts_shown(page: str) -> list[str]:
    """The draft comments a page lists, as ``PATH line N: TEXT``."""
    items = re.findall(r'<li class="review-draft"[^>]*>(.*?)</li>', page, re.S)
    return [re.sub(r"<[^>]+>", "", item).split(" (")[0].strip() for item in items]


def test_line_comments_are_drafts_until_sent_then_one_feedback_the_next_build_prompt_carries(
    diffed: tuple[TestClient, Engine, Store, Path],
) -> None:
    client, engine, store, prompts = diffed
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    csrf = _csrf(client)

    page = client.get(f"/workflows/{workflow_id}/diff").text
    assert 'data-path="feature.txt"' in page and "round 0" in page
    assert 'class="comment-on" data-path="feature.txt" data-line="1"' in page
    assert 'id="review-form"' in page and 'id="send-review"' in page

    # A line the diff does not show is refused, nothing recorded.
    before = store.workflow_row(workflow_id)
    stray = client.post(
        f"/workflows/{workflow_id}/comments",
        data={"path": "feature.txt", "line": "7", "text": "x", "csrf": csrf},
    )
    assert stray.status_code == 400
    assert operations.review_drafts(store, workflow_id) == []

    for text in ("Say which round", "and end with a newline"):
        sent = client.post(
            f"/workflows/{workflow_id}/comments",
            data={"path": "feature.txt", "line": "1", "text": text},
            headers={CSRF_HEADER: csrf, "HX-Request": "true"},
        )
        assert sent.status_code == 200 and 'id="review-drafts"' in sent.text
    # Drafts only: the workflow's row is as it was, so no worker would start a round.
    assert store.workflow_row(workflow_id) == before
    comments = ["feature.txt line 1: Say which round", "feature.txt line 1: and end with a newline"]
    assert _drafts_shown(client.get(f"/workflows/{workflow_id}/diff").text) == comments

    response = client.post(
        f"/workflows/{workflow_id}/review",
        data={"text": "Two things:", "csrf": csrf},
        follow_redirects=False,
    )
    assert (response.status_code, response.headers["location"]) == (
        303,
        f"/workflows/{workflow_id}/diff",
    )
    expected = (
        "Two things:\n\n"
        "Review comment on feature.txt line 1: Say which round\n\n"
        "Review comment on feature.txt line 1: and end with a newline"
    )
    assert store.workflow_row(workflow_id)["user_feedback"] == expected
    events = store.events(workflow_id)
    drafted = [e["id"] for e in events if e["type"] == review.REVIEW_COMMENT]
    [sent_event] = [e for e in events if e["type"] == review.REVIEW_SENT]
    assert sent_event["data"] == {"comments": drafted, "by": "alice"}
    decided = [e["data"] for e in events if e["type"] == operations.DECISION_EVENT]
    assert decided == [{"action": "review", "by": "alice"}]  # one feedback, not one per line
    # A reload shows no draft, and what the next round reads.
    page = client.get(f"/workflows/{workflow_id}/diff").text
    assert _drafts_shown(page) == [] and 'id="pending-feedback">Two things:' in page

    row = engine.advance(workflow_id)
    assert (row["status"], row["dev_round"]) == ("waiting", 2)
    assert "Review comment" not in (prompts / "build-0.txt").read_text()
    assert f"## Feedback from a person\n\n{expected}" in (prompts / "build-1.txt").read_text()


def test_comments_are_drafted_while_a_worker_holds_the_workflow_and_sent_when_it_lets_go(
    diffed: tuple[TestClient, Engine, Store, Path],
) -> None:
    client, engine, store, _prompts = diffed
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    csrf = _csrf(client)
    owner = f"{host_name()}:{os.getpid()}:elsewhere"  # a live holder: this very process
    assert store.claim(workflow_id, owner, 600) is not None

    for line in ("1", "1"):
        sent = client.post(
            f"/workflows/{workflow_id}/comments",
            data={"path": "feature.txt", "line": line, "text": "Name the round"},
            headers={CSRF_HEADER: csrf},
        )
        assert sent.status_code == 200  # the diff page, after the redirect
    with pytest.raises(LeaseHeld) as refused_in_cli:
        operations.send_review(engine, workflow_id, by="alice")
    held = client.post(f"/workflows/{workflow_id}/review", headers={CSRF_HEADER: csrf})
    assert (held.status_code, held.json()["detail"]) == (409, str(refused_in_cli.value))
    assert len(operations.review_drafts(store, workflow_id)) == 2  # kept for later
    assert store.workflow_row(workflow_id)["user_feedback"] is None

    store.release(workflow_id, owner)
    sent = client.post(
        f"/workflows/{workflow_id}/review", headers={CSRF_HEADER: csrf, "HX-Request": "true"}
    )
    assert sent.status_code == 200 and 'class="review-draft"' not in sent.text
    assert store.workflow_row(workflow_id)["user_feedback"].count("feature.txt line 1") == 2


def test_a_review_with_nothing_to_send_or_without_csrf_is_refused_and_records_nothing(
    diffed: tuple[TestClient, Engine, Store, Path],
) -> None:
    client, engine, store, _prompts = diffed
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    csrf = _csrf(client)
    before = (store.workflow_row(workflow_id), store.events(workflow_id))

    with pytest.raises(operations.ActionRefused) as refused_in_cli:
        operations.send_review(engine, workflow_id, "  ", by="alice")
    empty = client.post(f"/workflows/{workflow_id}/review", data={"text": " ", "csrf": csrf})
    assert (empty.status_code, empty.json()["detail"]) == (409, str(refused_in_cli.value))
    assert "no draft comment to send" in str(refused_in_cli.value)

    comment = {"path": "feature.txt", "line": "1", "text": "x"}
    assert client.post(f"/workflows/{workflow_id}/comments", data=comment).status_code == 403
    assert client.post(f"/workflows/{workflow_id}/review", data={"text": "y"}).status_code == 403
    blank = client.post(
        f"/workflows/{workflow_id}/comments", data={**comment, "text": "  ", "csrf": csrf}
    )
    assert (blank.status_code, blank.json()["detail"]) == (400, "the comment is empty")
    after = {**store.workflow_row(workflow_id), "fence": before[0]["fence"]}
    assert (after, store.events(workflow_id)) == before


def test_a_completed_workflow_takes_no_comment_the_same_refusal_as_operations(
    diffed: tuple[TestClient, Engine, Store, Path],
) -> None:
    client, engine, store, _prompts = diffed
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    csrf = _csrf(client)
    operations.cancel(engine, workflow_id, by="bob")
    with pytest.raises(PhasegateError) as refused_in_cli:
        operations.comment(engine, workflow_id, "feature.txt", 1, "late", by="alice")
    late = client.post(
        f"/workflows/{workflow_id}/comments",
        data={"path": "feature.txt", "line": "1", "text": "late", "csrf": csrf},
    )
    assert (late.status_code, late.json()["detail"]) == (409, str(refused_in_cli.value))
    # a line its diff does not show: the workflow's refusal still comes first
    elsewhere = client.post(
        f"/workflows/{workflow_id}/comments",
        data={"path": "feature.txt", "line": "999", "text": "late", "csrf": csrf},
    )
    assert (elsewhere.status_code, elsewhere.json()["detail"]) == (409, str(refused_in_cli.value))
    assert operations.review_drafts(store, workflow_id) == []
    # An ended workflow takes no review: the page offers none, not even an empty one.
    page = client.get(f"/workflows/{workflow_id}/diff").text
    assert 'id="review"' not in page and "no draft comment" not in page


def test_a_draft_is_a_comment_no_sent_review_lists_and_a_review_reads_in_order() -> None:
    def row(i: int, kind: str, **data: object) -> dict[str, object]:
        return {"id": i, "type": kind, "data": data}

    events = [
        row(1, review.REVIEW_COMMENT, path="a.py", line=3, text="one", by="alice"),
        row(2, "phase_change", phase="wait"),
        row(3, review.REVIEW_COMMENT, path="b.py", line=9, text="two", by="bob"),
        row(4, review.REVIEW_SENT, comments=[1], by="alice"),
        row(5, review.REVIEW_COMMENT, path="a.py", line=4, text="three", by="alice"),
    ]
    left = review.drafts(events)
    assert [(d.id, d.path, d.line, d.by) for d in left] == [
        (3, "b.py", 9, "bob"),
        (5, "a.py", 4, "alice"),
    ]
    assert review.review_feedback("Earlier words\n", "", left) == (
        "Earlier words\n\nReview comment on b.py line 9: two\n\n"
        "Review comment on a.py line 4: three"
    )


def test_parse_diff_numbers_each_line_as_in_the_base_and_the_branch() -> None:
    files = parse_diff(
        "diff --git a/a.txt b/a.txt\nindex 1..2 100644\n--- a/a.txt\n+++ b/a.txt\n"
        "@@ -3,3 +3,3 @@ def f():\n keep\n-old\n+new\n keep2\n"
        "diff --git a/b.txt b/b.txt\nnew file mode 100644\n--- /dev/null\n+++ b/b.txt\n"
        "@@ -0,0 +1 @@\n+only\n"
    )
    assert [f.path for f in files] == ["a.txt", "b.txt"]
    assert [(x.kind, x.text, x.old, x.new) for x in files[0].lines[1:]] == [
        ("ctx", "keep", 3, 3),
        ("del", "old", 4, None),
        ("add", "new", None, 4),
        ("ctx", "keep2", 5, 5),
    ]
    assert [(x.kind, x.new) for x in files[1].lines] == [("hunk", None), ("add", 1)]


def test_a_diff_line_is_highlighted_for_its_language_after_its_secrets_are_gone() -> None:
    secret = "sk-sentinel-4d2f9a7c1b"
    files = parse_diff(
        "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n"
        f'@@ -1 +1 @@\n-x = 1\n+KEY = "{secret}" if ready else None\n'
    )
    [shown] = files_as_dicts(files, lambda text: redact(text, [secret]))
    added = shown["lines"][-1]["html"]
    assert '<span class="k">if</span>' in added  # Python's keyword, highlighted
    assert secret not in added and "***" in added
    assert secret in files[0].lines[-1].text  # the test's premise: the diff held it
