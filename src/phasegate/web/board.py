"""Which cards a team's board shows: a search, filters, and the choices they offer.

The filters come from the page's address (``/?repository=web&person=alice``),
so a filtered board can be bookmarked and shared, and its live refresh reads
the same filter again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlencode

__all__ = ["BoardFilter", "choices", "filtered", "machine_of", "machines"]


@dataclass(frozen=True)
class BoardFilter:
    """What a person narrowed the board to; an empty field keeps every card.

    ``q`` is searched in each card's title and id, case ignored; the others
    must equal the card's repository, the person who started it, one of its
    issue's labels, and its profile."""

    q: str = ""
    repository: str = ""
    person: str = ""
    label: str = ""
    profile: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> BoardFilter:
        """The filter a request's query parameters name; unknown ones are ignored."""
        given = {f.name: str(params.get(f.name) or "").strip() for f in fields(cls)}
        return cls(**given)

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def query(self) -> str:
        """The filter as a query string (no ``?``), its empty fields left out."""
        return urlencode(
            {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}
        )

    def keeps(self, card: Mapping[str, Any]) -> bool:
        """Whether ``card`` (a board card: ``views.board``'s) passes every field."""
        needle = self.q.lower()
        title, workflow_id = str(card.get("title", "")).lower(), str(card.get("id", "")).lower()
        if needle and needle not in title and not workflow_id.startswith(needle):
            return False
        if self.repository and card.get("repository_shown") != self.repository:
            return False
        if self.person and card.get("started_by") != self.person:
            return False
        if self.label and self.label not in (card.get("labels") or ()):
            return False
        return not (self.profile and card.get("profile") != self.profile)

    def without(self, name: str) -> BoardFilter:
        """The same filter with field ``name`` emptied."""
        return replace(self, **{name: ""})


def filtered(
    groups: Sequence[Mapping[str, Any]], board_filter: BoardFilter
) -> list[dict[str, Any]]:
    """``groups`` (``views.board``'s) with only the cards ``board_filter`` keeps.
    An active filter's ``total`` counts the cards kept: the count a column heads
    is what it shows, and nothing reads as cut that the filter left out."""
    if not board_filter.active:
        return [dict(group) for group in groups]
    kept = [[c for c in group["cards"] if board_filter.keeps(c)] for group in groups]
    return [
        {**group, "cards": cards, "total": len(cards)}
        for group, cards in zip(groups, kept, strict=True)
    ]


def choices(groups: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each filter's values found on the board, sorted: ``repository``,
    ``person``, ``label``, ``profile``. A select offers them; more than one
    repository means the store is shared, and the cards name theirs."""
    found: dict[str, set[str]] = {
        "repository": set(),
        "person": set(),
        "label": set(),
        "profile": set(),
    }
    for group in groups:
        for card in group["cards"]:
            for key, value in (
                ("repository", card.get("repository_shown")),
                ("person", card.get("started_by")),
                ("profile", card.get("profile")),
            ):
                if value:
                    found[key].add(str(value))
            found["label"].update(str(label) for label in card.get("labels") or ())
    return {key: sorted(values) for key, values in found.items()}


def machines(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Which machine runs what: one ``{"host", "cards"}`` per machine whose
    worker holds a running card (``worker`` is ``host:pid:token``), by host name."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for group in groups:
        for card in group["cards"]:
            if group.get("key") == "running" and card.get("worker"):
                host = machine_of(card["worker"])
                found.setdefault(host, []).append(card)
    return [{"host": host, "cards": found[host]} for host in sorted(found)]


def machine_of(worker: str) -> str:
    """The machine a lease holder (``host:pid:token``) runs on: its host name."""
    return str(worker).rsplit(":", 2)[0]
