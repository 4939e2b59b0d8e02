"""A team's board: a column per state (queued apart from waiting), a search by
title or id, filters by repository, person, label and profile taken from the
address, and each card's repository once the store holds more than one.

FastAPI's TestClient drives the real app on one real SQLite store that two
real repositories share.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_web import TOKEN, logged_in

from phasegate import operations
from phasegate.config.cartridge import load_cartridge
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.board import BoardFilter, choices, filtered, machines

from conftest import HAPPY_ANSWERS, make_repo, scripted_cartridge


def repository(path: Path, store_file: Path) -> Path:
    repo = make_repo(path, {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    cartridge = scripted_cartridge(auto_merge=False)
    (repo / "phasegate.toml").write_text(f'{cartridge}\n[store]\nurl = "sqlite:///{store_file}"\n')
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    return repo


@pytest.fixture
def shared(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> Iterator[tuple[TestClient, Engine, Engine]]:
    store_file = tmp_path / "shared.db"
    web, store = engine_for(repository(tmp_path / "web", store_file))
    api = Engine(tmp_path / "api", load_cartridge(repository(tmp_path / "api", store_file)), store)
    with TestClient(create_app(web, Access(token=TOKEN, user="alice"))) as client:
        yield client, web, api


def cards(page: str) -> list[str]:
    return re.findall(r'<article class="card" id="card-(\w+)"', page)


def test_the_search_and_each_filter_keep_only_their_cards_and_survive_the_live_refresh(
    shared: tuple[TestClient, Engine, Engine],
) -> None:
    client, web, api = shared
    login = operations.start(web, "Add login", by="alice")["id"]
    logout = operations.start(web, "Add logout", by="bob", profile="trusted")["id"]
    cache = operations.start(api, "Cache the answers", by="bob")["id"]
    logged_in(client)

    board = client.get("/").text
    assert sorted(cards(board)) == sorted([login, logout, cache])
    # Two repositories in one store: every card names its own.
    assert board.count('class="wf-repository"') == 3 and ">api</dd>" in board
    assert re.findall(r'<section class="group group-(\w+)"', board) == [
        "needs_you", "running", "queued", "waiting", "done", "failed",
    ]  # fmt: skip
    queued = board.split('id="group-queued"')[1].split("<section")[0]
    assert len(cards(queued)) == 3

    assert cards(client.get("/?q=LOG").text) == [logout, login]  # newest first
    assert cards(client.get(f"/?q={cache[:4]}").text) == [cache]
    assert cards(client.get("/?repository=api").text) == [cache]
    assert sorted(cards(client.get("/?person=bob").text)) == sorted([logout, cache])
    assert cards(client.get("/?profile=trusted").text) == [logout]
    both = client.get("/?person=bob&repository=web")
    assert cards(both.text) == [logout]
    # The live refresh asks for the same filter, and the fragment honours it.
    assert 'hx-get="/board?repository=web&amp;person=bob"' in both.text
    assert cards(client.get("/board?repository=web&person=bob").text) == [logout]
    assert 'id="clear-filters"' in both.text and 'id="clear-filters"' not in board
    # The selects offer what the board holds.
    people = board.split('id="filter-person"')[1].split("</select>")[0]
    assert re.findall(r'<option value="(\w+)"', people) == ["alice", "bob"]


def test_a_label_filter_reads_the_labels_the_issue_carried() -> None:
    groups = [
        {"key": "queued", "title": "Queued", "cards": [
            {"id": "a1", "title": "One", "labels": ["phasegate", "bug"], "profile": "review"},
            {"id": "b2", "title": "Two", "labels": ["phasegate"], "profile": "review"},
            {"id": "c3", "title": "Three", "labels": [], "profile": "review"},
        ]},
    ]  # fmt: skip
    kept = filtered(groups, BoardFilter.of({"label": "bug", "unknown": "x"}))
    assert [c["id"] for c in kept[0]["cards"]] == ["a1"]
    assert choices(groups)["label"] == ["bug", "phasegate"]
    assert BoardFilter.of({"label": " bug "}).query() == "label=bug"
    assert not BoardFilter.of({}).active


def test_the_board_says_which_machine_runs_what(shared: tuple[TestClient, Engine, Engine]) -> None:
    client, web, _api = shared
    running = operations.start(web, "Held by a worker", by="alice")["id"]
    idle = operations.start(web, "Nobody holds it", by="alice")["id"]
    assert web.store.claim(running, f"{host_name()}:{os.getpid()}:worker", 600) is not None
    logged_in(client)

    strip = client.get("/").text.split('id="machines"')[1].split("</p>")[0]
    assert f'data-host="{host_name()}"' in strip
    assert f'href="/workflows/{running}"' in strip and idle not in strip

    groups = [
        {"key": "running", "cards": [
            {"id": "a1", "worker": "build-2:41:t1"}, {"id": "b2", "worker": "build-1:7:t2"},
            {"id": "c3", "worker": "build-2:42:t3"},
        ]},
        {"key": "queued", "cards": [{"id": "d4", "worker": None}]},
    ]  # fmt: skip
    found = [(m["host"], [c["id"] for c in m["cards"]]) for m in machines(groups)]
    assert found == [("build-1", ["b2"]), ("build-2", ["a1", "c3"])]


def test_a_filtered_board_counts_what_it_shows_and_keeps_an_unknown_value_selected(
    shared: tuple[TestClient, Engine, Engine],
) -> None:
    client, web, _api = shared
    held = operations.start(web, "Held by alice's worker", by="alice")["id"]
    operations.start(web, "Bob's", by="bob")
    assert web.store.claim(held, f"{host_name()}:{os.getpid()}:worker", 600) is not None
    logged_in(client)

    def column(page: str, key: str) -> str:
        return page.split(f'id="group-{key}"')[1].split("</section>")[0]

    running = column(client.get("/").text, "running")
    assert '<span class="count">1</span>' in running and cards(running) == [held]
    filtered_page = client.get("/?person=bob").text
    running = column(filtered_page, "running")
    assert '<span class="count">0</span>' in running and not cards(running)
    assert '<span class="count">1</span>' in column(filtered_page, "queued")
    assert 'class="more"' not in filtered_page

    # A value no card carries still reads as the filter in force.
    person = client.get("/?person=zed").text.split('id="filter-person"')[1].split("</select>")[0]
    assert '<option value="zed" selected>zed</option>' in person
