"""Calendar budgets: what a workflow's repository and the whole store may still spend
this UTC day and month, and the reason an agent call is refused once one is spent.

Two places set them. The cartridge's ``[limits] daily_budget_usd`` and
``monthly_budget_usd`` budget the repository it is committed in; ``phasegate
budget set`` budgets a repository, or the whole store (``--all``), in the
store (``phasegate.store.budgets``). When both set one kind for a repository,
the store's wins: a person raises it at once, without a commit, while
workflows wait on it, and the cartridge's stays the default for a repository
nobody budgeted by hand (docs/budgets.md). Days and months are UTC ones, the
same for every worker whatever its time zone.

The agent service asks before each call (``AgentService.budget_left``): the
smallest amount left is what the call may spend, and a call with nothing left
is not made. A call that crossed a budget is recorded whole, so the next call
finds it spent.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge
from phasegate.store import Store
from phasegate.store.budgets import BUDGET_KINDS, STORE_SCOPE, BudgetRefused

__all__ = [
    "Budget",
    "budget_report",
    "budgets_of",
    "calendar_budget",
    "costs_report",
    "period_starts",
    "repository_here",
    "since_of",
    "still_spent",
    "stop_reason",
]


@dataclass(frozen=True)
class Budget:
    """One budget and what was spent against it: ``scope`` (a repository, or
    STORE_SCOPE), ``kind`` (``daily``, ``monthly``), ``limit_usd`` and ``spent_usd``
    (USD), ``source`` (``store`` or ``cartridge``), ``period`` (the UTC day
    ``YYYY-MM-DD`` or month ``YYYY-MM`` it counts)."""

    scope: str
    kind: str
    limit_usd: float
    spent_usd: float
    source: str
    period: str

    @property
    def left_usd(self) -> float:
        """USD still to spend (below 0 once a call crossed it)."""
        return self.limit_usd - self.spent_usd

    @property
    def reached(self) -> bool:
        return self.spent_usd >= self.limit_usd

    @property
    def what(self) -> str:
        """``the daily budget of repository X`` / ``of the whole store``."""
        whose = "the whole store" if self.scope == STORE_SCOPE else f"repository {self.scope}"
        return f"the {self.kind} budget of {whose}"

    @property
    def raise_command(self) -> str:
        """The command that raises it."""
        target = "--all" if self.scope == STORE_SCOPE else f"--repository {shlex.quote(self.scope)}"
        return f"phasegate budget set --{self.kind} USD {target}"

    @property
    def spent_line(self) -> str:
        """``the daily budget of repository X is spent ($0.0400 of $0.0350, UTC day
        2026-12-06)``."""
        period = f"UTC {'day' if self.kind == 'daily' else 'month'} {self.period}"
        return f"{self.what} is spent (${self.spent_usd:.4f} of ${self.limit_usd:.4f}, {period})"

    def reason(self, workflow_id: str, moment: str) -> str:
        """The pause reason of ``workflow_id`` when this budget refused its call at
        ``moment`` (``before the plan agent ran``): ``budget: ``, which budget,
        spent of limit, then the commands that raise it and resume the workflow.
        The commands come early, for notifications cut a reason at 300
        characters; where the budget is set comes last."""
        where = (
            "set with phasegate budget set"
            if self.source == "store"
            else f"set by [limits] {BUDGET_KINDS[self.kind].replace('_usd', '_budget_usd')} "
            f"in {CARTRIDGE_FILE}"
        )
        # Both commands are typed in the workflow's clone, whose own repository
        # ``budget set`` budgets: a clone's path, often long, is said only once.
        raise_it = self.raise_command
        if self.scope.startswith("/"):
            raise_it = raise_it.removesuffix(f" --repository {shlex.quote(self.scope)}")
        return (
            f"budget: {self.spent_line} {moment}; raise it: {raise_it}, "
            f"then phasegate resume {workflow_id} (the budget is {where})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "scope": self.scope,
            "kind": self.kind,
            "limit_usd": self.limit_usd,
            "spent_usd": round(self.spent_usd, 6),
            "left_usd": round(self.left_usd, 6),
            "reached": self.reached,
            "source": self.source,
            "period": self.period,
        }


def period_starts(now: datetime) -> tuple[datetime, datetime]:
    """The starts (UTC, aware) of the UTC day and of the UTC month ``now`` is in."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def budgets_of(
    store: Store, cartridge: Cartridge | None, repository: str, *, everyone: bool = True
) -> list[Budget]:
    """The budgets a call in ``repository`` is held to, with this day's and month's
    spend: the repository's (the store's setting of each kind, else the
    ``cartridge``'s) and, with ``everyone``, the whole store's. Raises
    StoreUnavailable."""
    set_here = store.budgets([repository, STORE_SCOPE])
    limits = cartridge.limits if cartridge is not None else None
    wanted: list[tuple[str, str, float, str]] = []  # scope, kind, limit, source
    for kind, column in BUDGET_KINDS.items():
        row = set_here.get(repository) or {}
        if row.get(column) is not None:
            wanted.append((repository, kind, float(row[column]), "store"))
        elif limits is not None:
            from_cartridge = getattr(limits, column.replace("_usd", "_budget_usd"))
            if from_cartridge is not None:
                wanted.append((repository, kind, float(from_cartridge), "cartridge"))
        whole = set_here.get(STORE_SCOPE) or {}
        if everyone and whole.get(column) is not None:
            wanted.append((STORE_SCOPE, kind, float(whole[column]), "store"))
    if not wanted:
        return []
    now = store.clock.now()
    day, month = period_starts(now)
    spent = {
        scope: store.spend(day, month, None if scope == STORE_SCOPE else scope)
        for scope in {w[0] for w in wanted}
    }
    return [
        Budget(
            scope,
            kind,
            limit,
            spent[scope].day_usd if kind == "daily" else spent[scope].month_usd,
            source,
            f"{day:%Y-%m-%d}" if kind == "daily" else f"{day:%Y-%m}",
        )
        for scope, kind, limit, source in wanted
    ]


def calendar_budget(store: Store, cartridge: Cartridge, workflow_id: str) -> Budget | None:
    """The budget ``workflow_id``'s next call is closest to spending (the least
    left), or None when none applies. Raises StoreUnavailable."""
    found = budgets_of(store, cartridge, store.workflow_repository(workflow_id))
    return min(found, key=lambda b: b.left_usd) if found else None


def stop_reason(store: Store, cartridge: Cartridge, workflow_id: str, moment: str) -> str | None:
    """The pause reason (``Budget.reason``) when a daily or monthly budget is what
    refused ``workflow_id``'s call at ``moment``, else None: the call was stopped
    by a role's or the workflow's spend cap (the cartridge's ``budget_usd``,
    ``limits.workflow_budget_usd``). Raises StoreUnavailable."""
    spent = calendar_budget(store, cartridge, workflow_id)
    if spent is not None and spent.reached:
        return spent.reason(workflow_id, moment)
    return None


def still_spent(store: Store, cartridge: Cartridge | None, repository: str) -> list[Budget]:
    """The budgets a call in ``repository`` is held to that are spent now (its own,
    with ``cartridge``'s counted when it is the cartridge's repository, and the
    whole store's): what still keeps its paused workflows from going on. Raises
    StoreUnavailable."""
    return [b for b in budgets_of(store, cartridge, repository) if b.reached]


def budget_report(store: Store, cartridge: Cartridge | None, here: str | None) -> list[Budget]:
    """Every budget and what was spent against it, for ``phasegate budget`` and the
    costs page: the whole store's, the repository ``here``'s (the cartridge's
    counted too), then every other repository budgeted in the store."""
    report = budgets_of(store, None, STORE_SCOPE, everyone=False)
    if here is not None and here != STORE_SCOPE:
        report += budgets_of(store, cartridge, here, everyone=False)
    for scope in store.budgets():
        if scope not in (STORE_SCOPE, here):
            report += budgets_of(store, None, scope, everyone=False)
    return report


def repository_here(store: Store, cartridge: Cartridge, root: Path) -> str:
    """The repository the clone at ``root`` runs workflows of, as budgets name it:
    the team forge's ``owner/name`` (lower-cased; from the cartridge, else from
    a workflow started here), else the clone's path."""
    if cartridge.forge.kind != "local":
        if cartridge.forge.repository:
            return cartridge.forge.repository.lower()
        started = store.repository_at(str(root))
        if started is not None:
            return started
    return str(root)


_DAYS = re.compile(r"^(\d{1,5})d$")


def since_of(text: str | None, now: datetime) -> datetime | None:
    """The start (UTC, aware) ``text`` names: ``YYYY-MM-DD`` (that UTC day's
    midnight), ``Nd`` (N whole UTC days: the start of the UTC day N-1 days
    before ``now``'s, so ``1d`` is ``today``), ``today`` or ``month`` (the UTC
    day's or month's start); None for None or empty. Raises BudgetRefused."""
    if not text:
        return None
    text = text.strip().lower()
    day, month = period_starts(now)
    if text in ("today", "month"):
        return day if text == "today" else month
    days = _DAYS.match(text)
    if days and int(days.group(1)) > 0:
        return day - timedelta(days=int(days.group(1)) - 1)
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise BudgetRefused(
            "since takes a date (2026-12-01, from 00:00 UTC), a number of whole UTC days "
            f"(7d: today and the 6 days before), today or month; not {text!r}"
        ) from None


def costs_report(store: Store, by: str, since: datetime | None) -> dict[str, Any]:
    """What ``phasegate costs`` and the costs page show: ``by``, ``since`` (ISO 8601
    or None), ``rows`` (``Store.costs``) and their ``total`` (``cost_usd`` in USD,
    ``input_tokens``, ``output_tokens``, ``calls``). Raises BudgetRefused."""
    rows = store.costs(by, since)
    total = {
        "cost_usd": round(sum(r["cost_usd"] for r in rows), 6),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "calls": sum(r["calls"] for r in rows),
    }
    return {
        "by": by,
        "since": since.isoformat() if since is not None else None,
        "rows": rows,
        "total": total,
    }
