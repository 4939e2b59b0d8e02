"""Budgets and spend: the daily and monthly budgets a person set in the store, and what
agents spent, summed against a budget or grouped for ``phasegate costs``.

A budget's scope is a repository as its workflows name it (``repository_key``: the
team forge's ``owner/name``, else the clone's path) or ``STORE_SCOPE``, the
whole store. Amounts are USD; a day and a month are UTC ones, and their
starts are given by the caller (``phasegate.agents.budgets``), which also
decides between a budget set here and one in the cartridge. The rules of a
person's setting live here, in the transaction that applies it, so the command
line and the dashboard refuse alike.

Errors::

    PhasegateError
     └── BudgetRefused   an amount that is no positive number of USD, an empty or
                         overlong scope, a repository this store holds no workflow
                         of, a grouping or a ``since`` ``costs`` does not know
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import PhasegateError
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc_row
from phasegate.store.values import COST_GROUPS, STORE_SCOPE

__all__ = [
    "BUDGET_KINDS",
    "COST_GROUPS",
    "MAX_BUDGET_USD",
    "repository_key",
    "STORE_SCOPE",
    "BudgetRefused",
    "BudgetRows",
    "Spend",
    "check_amount",
]

#: The kinds of budget, each the column that holds it.
BUDGET_KINDS = {"daily": "daily_usd", "monthly": "monthly_usd"}

#: The largest budget accepted, USD: a larger one is a typo, not a plan.
MAX_BUDGET_USD = 1_000_000_000.0

_w = t.workflows.c
_a = t.agent_runs.c
_b = t.budgets.c

#: A workflow's repository, as budgets and ``costs --by repository`` name it: the
#: team forge's ``owner/name``, else the path of the clone it runs in.
repository_key = sa.func.coalesce(_w.repository, _w.repo_path)


class BudgetRefused(PhasegateError):
    """A budget that cannot be set (its amount, its scope), or costs asked by an
    unknown grouping; nothing was written."""


@dataclass(frozen=True)
class Spend:
    """USD agents spent since the start of a day and of a month."""

    day_usd: float = 0.0
    month_usd: float = 0.0


def check_amount(kind: str, usd: float | None) -> float | None:
    """``usd`` as a budget of ``kind`` (``daily``, ``monthly``): None (no budget) or a
    finite amount above 0 and at most MAX_BUDGET_USD. Raises BudgetRefused."""
    if usd is None:
        return None
    if not (isinstance(usd, int | float) and math.isfinite(usd) and 0 < usd <= MAX_BUDGET_USD):
        raise BudgetRefused(
            f"the {kind} budget must be more than 0 and at most {MAX_BUDGET_USD:,.0f} USD, "
            f"not {usd!r}"
        )
    return float(usd)


class BudgetRows(StoreBase):
    """Budgets set in the store, and agents' spend."""

    def set_budget(
        self, scope: str, amounts: Mapping[str, float | None], *, by: str
    ) -> dict[str, Any]:
        """Set the budgets of ``scope`` (a repository, or STORE_SCOPE) named in
        ``amounts`` (``daily``, ``monthly``: USD, or None to remove it); a kind not
        named keeps its value. Returns the scope's row (``scope``, ``daily_usd``,
        ``monthly_usd``, ``set_by``, ``updated_at``). Raises BudgetRefused."""
        scope = scope.strip()
        if not scope or len(scope) > 1024:
            raise BudgetRefused("a budget's repository must be named (1 to 1024 characters)")
        unknown = sorted(set(amounts) - set(BUDGET_KINDS))
        if unknown or not amounts:
            raise BudgetRefused(
                "say which budget to set: " + ", ".join(BUDGET_KINDS) + f" (not {unknown})"
            )
        values = {BUDGET_KINDS[k]: check_amount(k, v) for k, v in amounts.items()}
        now = self.clock.now()
        insert = self.dialect.insert(t.budgets).values(
            {
                "daily_usd": None,
                "monthly_usd": None,
                **values,
                "scope": scope,
                "set_by": by,
                "updated_at": now,
            }
        )
        with self.transaction() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["scope"], set_={**values, "set_by": by, "updated_at": now}
                )
            )
            row = conn.execute(sa.select(t.budgets).where(_b.scope == scope)).mappings().one()
        return utc_row(row)

    def budgets(self, scopes: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
        """The budgets set in the store (of ``scopes`` only, if given), by scope; a
        scope whose budgets were all removed is left out."""
        query = sa.select(t.budgets).where(
            sa.or_(_b.daily_usd.is_not(None), _b.monthly_usd.is_not(None))
        )
        if scopes is not None:
            query = query.where(_b.scope.in_(sorted(scopes)))
        with self.reading() as conn:
            rows = conn.execute(query.order_by(_b.scope)).mappings()
            return {str(r["scope"]): utc_row(r) for r in rows}

    def workflow_repository(self, workflow_id: str) -> str:
        """The repository ``workflow_id`` is of (``repository_key``). Raises KeyError when
        there is no such workflow."""
        with self.reading() as conn:
            found = conn.execute(sa.select(repository_key).where(_w.id == workflow_id)).scalar()
        if found is None:
            raise KeyError(workflow_id)
        return str(found)

    def repository_at(self, repo_path: str) -> str | None:
        """The team forge repository (``owner/name``) of the newest workflow started in
        the clone at ``repo_path`` that names one, else None."""
        query = (
            sa.select(_w.repository)
            .where(_w.repo_path == repo_path, _w.repository.is_not(None))
            .order_by(_w.created_at.desc())
            .limit(1)
        )
        with self.reading() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else str(found)

    def holds_repository(self, name: str) -> bool:
        """Whether the store holds a workflow of ``name``: a repository as budgets name
        it (``repository_key``), or the path of the clone a workflow started in."""
        query = sa.select(_w.id).where(sa.or_(repository_key == name, _w.repo_path == name))
        with self.reading() as conn:
            return conn.execute(query.limit(1)).first() is not None

    def spend(
        self, day_start: datetime, month_start: datetime, repository: str | None = None
    ) -> Spend:
        """USD agents spent since ``day_start`` and since ``month_start`` (the earlier),
        in the workflows of ``repository``, or in the whole store when None."""
        day = sa.func.coalesce(
            sa.func.sum(sa.case((_a.created_at >= day_start, _a.cost_usd), else_=0.0)), 0.0
        )
        query = sa.select(day, sa.func.coalesce(sa.func.sum(_a.cost_usd), 0.0)).where(
            _a.created_at >= month_start
        )
        if repository is not None:
            query = query.join_from(t.agent_runs, t.workflows, _a.workflow_id == _w.id).where(
                repository_key == repository
            )
        with self.reading() as conn:
            row = conn.execute(query).one()
        return Spend(float(row[0]), float(row[1]))

    def costs(self, by: str, since: datetime | None = None) -> list[dict[str, Any]]:
        """Agents' spend grouped ``by`` one of COST_GROUPS (``day``: the UTC date,
        ``model``: the binding's model, else the runner's name), since ``since`` if
        given: rows of ``key``, ``cost_usd`` (USD), ``input_tokens``,
        ``output_tokens`` and ``calls``; days in order, any other grouping the
        costliest first. Raises BudgetRefused for another grouping."""
        if by not in COST_GROUPS:
            raise BudgetRefused(f"costs are grouped by {', '.join(COST_GROUPS)}, not {by!r}")
        key = {
            "repository": repository_key,
            "model": sa.func.coalesce(sa.func.nullif(_a.model, ""), _a.runner),
            "role": _a.role,
            "day": self._utc_day(),
            "workflow": _a.workflow_id,
        }[by].label("key")
        cost = sa.func.coalesce(sa.func.sum(_a.cost_usd), 0.0).label("cost_usd")
        query = sa.select(
            key,
            cost,
            sa.func.coalesce(sa.func.sum(_a.input_tokens), 0).label("input_tokens"),
            sa.func.coalesce(sa.func.sum(_a.output_tokens), 0).label("output_tokens"),
            sa.func.count().label("calls"),
        ).select_from(t.agent_runs)
        if by == "repository":
            query = query.join(t.workflows, _a.workflow_id == _w.id)
        if since is not None:
            query = query.where(_a.created_at >= since)
        order = [key] if by == "day" else [cost.desc(), key]
        with self.reading() as conn:
            rows = conn.execute(query.group_by(key).order_by(*order)).mappings()
            return [
                {
                    "key": str(r["key"]),
                    "cost_usd": round(float(r["cost_usd"]), 6),
                    "input_tokens": int(r["input_tokens"]),
                    "output_tokens": int(r["output_tokens"]),
                    "calls": int(r["calls"]),
                }
                for r in rows
            ]

    def budget_pauses(self, repository: str | None = None) -> list[dict[str, Any]]:
        """The workflows paused on a budget (reason ``budget: ...``), of ``repository``
        only if given, oldest first: ``id``, ``title``, ``repository``, ``error``."""
        query = sa.select(_w.id, _w.title, repository_key.label("repository"), _w.error).where(
            _w.status == "paused", _w.error.startswith("budget:", autoescape=True)
        )
        if repository is not None:
            query = query.where(repository_key == repository)
        with self.reading() as conn:
            rows = conn.execute(query.order_by(_w.created_at, _w.id)).mappings()
            return [dict(r) for r in rows]

    def _utc_day(self) -> sa.ColumnElement[Any]:
        """An agent run's UTC date as ``YYYY-MM-DD`` text. SQLite keeps the UTC time
        the store wrote as text; PostgreSQL a time zone aware time, turned to UTC."""
        if self.dialect.name == "postgresql":
            return sa.func.to_char(sa.func.timezone("UTC", _a.created_at), "YYYY-MM-DD")
        return sa.func.substr(_a.created_at, 1, 10)
