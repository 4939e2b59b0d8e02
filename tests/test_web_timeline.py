"""A workflow page's history and report as a person reads them: cycles in time
order, milestones in words, times relative with the exact one on hover, the
report's Markdown rendered, sanitized, in the viewer's language."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from phasegate.web.markdown import to_html, viewer_language
from phasegate.web.timeline import cycles, exact_time, milestone_words, relative_time, when

START = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def at(minutes: int) -> str:
    return (START + timedelta(minutes=minutes)).isoformat()


def entered(*phases: str) -> list[dict[str, str]]:
    return [{"phase": phase, "at": at(10 * i)} for i, phase in enumerate(phases)]


def test_a_feedback_round_and_a_reversion_each_start_a_cycle_in_time_order() -> None:
    timeline = entered(
        "preparation", "planning", "development", "pr_review", "report", "wait",
        "development", "pr_review", "report", "wait",  # a person's feedback: round 2
        "planning", "development",  # reverted to planning
    )  # fmt: skip
    milestones = [
        {"kind": "plan_finalized", "round": 0, "status": "completed", "created_at": at(15)},
        {"kind": "dev_completed", "round": 1, "status": "completed", "created_at": at(25)},
        {"kind": "dev_completed", "round": 2, "status": "failed", "created_at": at(65)},
    ]
    decisions = [{"source_phase": "wait", "target_phase": "planning", "reason": "wrong API"}]

    found = cycles(timeline, milestones, decisions)

    assert [c["kind"] for c in found] == ["first", "feedback", "reversion"]
    assert found[2]["title"] == "Cycle 3: back to planning: wrong API"
    assert [p["phase"] for p in found[1]["phases"]] == [
        "development",
        "pr_review",
        "report",
        "wait",
    ]
    # Each milestone sits in the phase that was running when it was written.
    placed = {
        m["words"]: (c["number"], p["phase"])
        for c in found
        for p in c["phases"]
        for m in p["milestones"]
    }
    assert placed == {
        "plan finalized": (1, "planning"),
        "build of round 1": (1, "development"),
        "build of round 2 failed": (2, "development"),
    }


def test_a_workflow_with_no_phase_entered_yet_still_shows_its_milestones() -> None:
    found = cycles([], [{"kind": "requirement_received", "round": 0, "status": "completed"}])
    assert len(found) == 1
    assert found[0]["phases"][0]["milestones"][0]["words"] == "ticket received"


def test_milestones_read_as_words_and_unknown_kinds_as_their_spaced_name() -> None:
    assert milestone_words({"kind": "merge_completed", "status": "completed"}) == "merged"
    assert milestone_words({"kind": "round_completed", "round": 3, "status": "in_progress"}) == (
        "review of round 3 in progress"
    )
    assert milestone_words({"kind": "some_new_thing", "status": "completed"}) == "some new thing"


def test_times_are_relative_with_the_exact_second_on_hover() -> None:
    now = START + timedelta(hours=5)
    assert relative_time(START + timedelta(hours=5, seconds=-10), now) == "just now"
    assert relative_time(START + timedelta(hours=4, minutes=53), now) == "7 min ago"
    assert relative_time(START, now) == "5 h ago"
    assert relative_time(START - timedelta(days=1), now) == "1 day ago"
    assert relative_time(START - timedelta(days=90), now) == "2026-09-06"
    assert exact_time("2026-12-05T09:00:00.123456+00:00") == "2026-12-05 09:00:00 UTC"
    shown = str(when(START, now))
    assert 'title="2026-12-05 09:00:00 UTC"' in shown and ">5 h ago</time>" in shown
    assert str(when(None, now)) == ""


def test_markdown_renders_and_nothing_an_agent_wrote_can_run() -> None:
    text = (
        "## Checks\n\n| check | result |\n|---|---|\n| tests | passed |\n\n"
        '<script>alert(1)</script> <img src=x onerror="alert(2)">\n\n'
        "[bad](javascript:alert(3)) [good](https://example.com/x)\n"
    )
    html = str(to_html(text))
    assert "<h2>Checks</h2>" in html and "<td>passed</td>" in html
    assert "<script>" not in html and "<img" not in html  # both stay visible text
    assert 'href="javascript' not in html
    assert '<a href="https://example.com/x" rel="noopener noreferrer">good</a>' in html
    assert str(to_html(None)) == ""


def test_the_viewers_language_comes_from_their_choice_then_their_browser() -> None:
    assert viewer_language("zh", {"accept-language": "en"}) == "zh"
    assert viewer_language("fr", {"accept-language": "zh-CN,zh;q=0.9,en;q=0.8"}) == "zh"
    assert viewer_language(None, {"accept-language": "de, en;q=0.3, zh;q=0.2"}) == "en"
    assert viewer_language(None, {"accept-language": "zh;q=0, en;q=0.1"}) == "en"
    assert viewer_language(None, {}) == "en"
