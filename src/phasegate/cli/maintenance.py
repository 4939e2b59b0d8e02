"""A store's upkeep: ``prune`` (old events of finished workflows) and ``backup``
(an online copy of a SQLite store). docs/operations-at-scale.md says when."""

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from phasegate.cli._app import (
    JsonOption,
    RepoOption,
    app,
    console,
    open_repo,
    reading_url,
    reported_errors,
)


@app.command()
def prune(
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than",
            min=0,
            metavar="DAYS",
            help="Prune finished workflows whose last change is at least DAYS days old.",
        ),
    ],
    repo: RepoOption = Path("."),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete old finished workflows' events, counted.

    The agent output and events of finished workflows older than DAYS go.
    Finished: completed, cancelled, or failed, unchanged for DAYS days (its
    completion, else its last update), no lease held. Each keeps its trail
    (phases entered, decisions, reversions, violations, review comments,
    forge commands, notifications), its milestones, agent runs (tokens, cost), graph runs and
    proposals; what was deleted is counted in an events_pruned event that
    `show` reports. Safe while workers run: one short transaction a workflow.
    """
    with reported_errors():
        _root, _cartridge, store = open_repo(repo)
        before = store.clock.now() - timedelta(days=older_than)
        pruned = store.prune(before, dry_run=dry_run)
    shaped = {
        "dry_run": dry_run,
        "older_than_days": older_than,
        "before": before.isoformat(),
        "workflows": len(pruned.workflows),
        "workflow_ids": pruned.workflows,
        "events": pruned.events,
        "event_count": pruned.event_count,
        "graph_calls": pruned.graph_calls,
    }
    if as_json:
        print(json.dumps(shaped, indent=2))
        return
    verb = "would prune" if dry_run else "pruned"
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(pruned.events.items(), key=lambda i: -i[1]))
    console.print(
        f"{verb} {len(pruned.workflows):,} finished workflow(s) unchanged since "
        f"{before:%Y-%m-%d %H:%M} UTC: {pruned.event_count:,} events"
        + (f" ({kinds})" if kinds else "")
        + f", {pruned.graph_calls:,} graph call rows; their trail, milestones and totals stay",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def backup(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Where the copy is written.")],
    repo: RepoOption = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace FILE if it exists.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Back up the SQLite store, while workers run.

    FILE gets a copy of the store, taken with SQLite's backup API.

    The copy is the store at one commit, a store of its own: point a cartridge's
    [store] url at it to read it. FILE is not replaced without --force. A
    PostgreSQL store is backed up with pg_dump (docs/operations-at-scale.md).
    """
    from phasegate.store.backup import backup_sqlite

    with reported_errors():
        size = backup_sqlite(reading_url(repo), file, force=force)
    if as_json:
        print(json.dumps({"file": str(file.resolve()), "bytes": size}))
        return
    console.print(f"backed up the store to {file.resolve()} ({size:,} bytes)", highlight=False)


__all__ = ["backup", "prune"]
