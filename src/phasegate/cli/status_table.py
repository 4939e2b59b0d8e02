"""``phasegate status``'s table: which columns fit a terminal's width, and their cells."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from phasegate.cli._app import repo_option, shown
from phasegate.core.contract import NEEDS_YOU_STATUSES, RUNNABLE_STATUSES
from phasegate.core.priority import priority_name
from phasegate.core.terminal import visible

#: status's columns, in the order shown; the ones a narrow terminal drops first
#: come last in _OPTIONAL (id, phase and status are always whole).
_STATUS_COLUMNS = (
    "id",
    "title",
    "phase",
    "status",
    "priority",
    "repository",
    "worker",
    "profile",
    "tokens",
    "cost (USD)",
    "updated",
)
_OPTIONAL = ("worker", "tokens", "cost (USD)", "profile", "updated")
_MIN_TITLE = 12  # the least a title gets, even in the worst case at 80 columns
_TITLE_FIRST = 20  # what a title gets before an optional column does


def _status_cells(r: Mapping[str, Any], wide: bool) -> dict[str, str]:
    updated = r["updated_at"] or ""
    title = visible(r["title"], one_line=True)
    if r.get("parent_workflow_id"):
        title = f"child of {r['parent_workflow_id']}: {title}"
    return {
        "id": r["id"],
        "title": title if len(title) <= 40 else title[:39] + "…",
        "phase": r["current_phase"],
        "status": r["status"],
        "priority": priority_name(int(r.get("priority") or 0)),
        "repository": r.get("repository") or Path(str(r.get("repo_path") or "")).name,
        # host:pid, enough to find the process (--json has the whole owner)
        "worker": ":".join(str(r.get("worker") or "").split(":")[:2]),
        "profile": r["profile"],
        "tokens": str(r["tokens"]),
        "cost (USD)": f"{r['cost_usd']:.4f}",
        # UTC; the date goes first when space is short (today's rows matter most)
        "updated": updated[:19].replace("T", " ") if wide else updated[11:16],
    }


#: How many workflows the line under the table names before "and N more".
SHOWN_IDS = 5


def _widest(cells: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows holding some column's widest cell, each once, in their order."""
    chosen = (
        {id(max(cells, key=lambda c: cell_len(c[k]))) for k in _STATUS_COLUMNS} if cells else set()
    )
    return [c for c in cells if id(c) in chosen]


def hidden_note(rows: list[dict[str, Any]], totals: Mapping[str, int]) -> str | None:
    """A line saying how many finished workflows the table leaves out (``totals``:
    each finished group's count, as ``board_rows`` gives it), else None."""
    listed = sum(1 for r in rows if r["status"] in ("completed", "cancelled", "failed"))
    left = sum(totals.values()) - listed
    if left <= 0:
        return None
    return f"{left:,} older finished workflows not listed: `phasegate status --all` lists them."


def unheld_note(rows: list[dict[str, Any]]) -> str | None:
    """A line naming the workflows mid-lifecycle that no worker is advancing now (a run
    stopped by Ctrl-C, a worker that ended, a ticket filed without advancing it, or one
    a running worker looks at again later, a forge pause it resumes later), and the
    commands that go on with them;
    None when there are none."""
    # A person moves on the ones that need them: those are not stuck. A forge pause
    # with a resume time (runtime/outage.py) goes on only where a worker runs.
    moving = RUNNABLE_STATUSES - NEEDS_YOU_STATUSES
    unheld = [
        r for r in rows if (r["status"] in moving or r.get("resumes_at")) and not r.get("worker")
    ]
    if not unheld:
        return None
    ids = ", ".join(r["id"] for r in unheld[:SHOWN_IDS])
    ids += f" and {len(unheld) - SHOWN_IDS} more" if len(unheld) > SHOWN_IDS else ""
    one = len(unheld) == 1
    at = repo_option(unheld[0])
    it = "it" if one else "them"
    resume = f"`phasegate resume {unheld[0]['id'] if one else 'ID'}{at}`"
    # A lease does not say whether its holder is a worker that takes these next or a
    # `run` that will not: the line says what goes on with them either way.
    return (
        f"{ids} {'is' if one else 'are'} not being advanced now (no worker holds {it}). "
        f"Unless a `phasegate worker{at}` is running, {resume} goes on with "
        f"{'it' if one else 'one'}, `phasegate worker{at}` with every one."
    )


def pieces_in_place(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (workflow summaries) with each epic's pieces in their places' order
    (filed in one moment, they have no order of their own), in the slots the pieces
    held; every other row where it was."""
    place = {p["id"]: p["position"] for r in rows for p in r.get("pieces") or ()}
    slots: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.get("epic_parent") and r["id"] in place:
            slots.setdefault(r["epic_parent"], []).append(i)
    ordered = list(rows)
    for held in slots.values():
        in_place = sorted((rows[i] for i in held), key=lambda r: place[r["id"]])
        for i, row in zip(held, in_place, strict=True):
            ordered[i] = row
    return ordered


def status_table(rows: list[dict[str, Any]], width: int) -> Table:
    """``status``'s table, fitted to ``width`` columns: id, phase and status are
    never cut, nor the repository when the rows are of several (a shared store); the
    title is cut with an ellipsis, and what does not fit
    (updated, then profile, cost, tokens, then the worker holding it: shown only
    while a worker holds one) is left out, for ``--json`` to give.
    Wide (100 columns or more): boxed; narrower: no rules, to leave the text room."""
    wide = width >= 100
    cells = [_status_cells(r, wide) for r in rows]
    # A column is as wide as its widest cell: the widest row of each column measures
    # the same as all of them, at a fraction of rich's cost for hundreds of rows.
    widest = _widest(cells)

    def table_of(columns: list[str], title: int | None, of: list[dict[str, str]] = cells) -> Table:
        table = (
            Table(box=box.HEAVY_HEAD)
            if wide
            else Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        )
        for c in columns:
            header = "updated (UTC)" if c == "updated" and wide else c
            if c == "title":
                table.add_column(header, overflow="ellipsis", no_wrap=True, max_width=title)
            else:
                table.add_column(header, no_wrap=True)
        for row in of:
            table.add_row(*(shown(row[c]) if c == "title" else row[c] for c in columns))
        return table

    def needs(columns: list[str]) -> int:
        """The width the table takes with ``columns`` and a title of _TITLE_FIRST."""
        return Console(width=10_000).measure(table_of(columns, _TITLE_FIRST, widest)).maximum

    fits = ["id", "title", "phase", "status"]
    held = any(r.get("worker") for r in rows)  # the column only while a worker holds one
    # ... the priority only when some workflow has one other than normal
    if any(r.get("priority") for r in rows):
        fits.append("priority")
    # ... and the repository's only when the store holds more than one's (a shared store)
    if len({c["repository"] for c in cells}) > 1:
        fits.append("repository")
    for column in (c for c in _OPTIONAL if held or c != "worker"):
        if needs([*fits, column]) <= width:
            fits.append(column)
    fits = [c for c in _STATUS_COLUMNS if c in fits]
    # the title gets what the other columns leave, so rich cuts nothing else
    return table_of(fits, max(_MIN_TITLE, _TITLE_FIRST + width - needs(fits)))
