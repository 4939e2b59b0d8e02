"""Markdown an agent or a report wrote, as HTML safe to put in a page, in the viewer's language.

An agent writes the plan and much of the report, so their Markdown is
untrusted. markdown-it renders it with raw HTML off (a ``<script>`` in it
stays text) and refuses ``javascript:`` links; nh3 (the Ammonia sanitizer)
then keeps only the tags and attributes below, a second wall should the
renderer ever let something through.
"""

from __future__ import annotations

from collections.abc import Mapping

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup

__all__ = ["LANGUAGES", "to_html", "viewer_language"]

#: The languages a report renders in; the first is the fallback.
LANGUAGES = ("en", "zh")

_RENDERER = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_TAGS = {
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href", "title"}, "td": {"style"}, "th": {"style"}}
#: What a link may point at: no script, no data, no file of the server.
_SCHEMES = {"http", "https", "mailto"}


def to_html(text: str | None) -> Markup:
    """``text`` (Markdown) as sanitized HTML: headings, lists, tables, code,
    links (http, https and mailto only, opened with ``rel="noopener noreferrer"``).
    Empty Markup for no text."""
    if not text:
        return Markup("")
    rendered = _RENDERER.render(text)
    cleaned = nh3.clean(
        rendered,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_SCHEMES,
        link_rel="noopener noreferrer",
        filter_style_properties={"text-align"},
    )
    return Markup(cleaned)


def viewer_language(chosen: str | None, headers: Mapping[str, str]) -> str:
    """The language a person reads a report in: ``chosen`` (their setting, or
    ``?lang=``) when it is one of LANGUAGES, else the first of LANGUAGES their
    browser's ``Accept-Language`` prefers by weight, else English."""
    if chosen in LANGUAGES:
        return chosen
    ranked: list[tuple[float, int, str]] = []
    for index, part in enumerate(headers.get("accept-language", "").split(",")):
        tag, _, params = part.strip().partition(";")
        weight = 1.0
        if params.strip().startswith("q="):
            try:
                weight = float(params.strip()[2:])
            except ValueError:
                continue
        primary = tag.strip().lower().split("-")[0]
        if primary in LANGUAGES and weight > 0:
            ranked.append((-weight, index, primary))
    return min(ranked)[2] if ranked else LANGUAGES[0]
