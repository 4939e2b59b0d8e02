"""The people of the dashboard: the store's rules on a real SQLite file and a real
PostgreSQL server (the ``store_url`` fixture), and ``phasegate users`` as a person
types it."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from phasegate.operations import login_name
from phasegate.store import Store, open_store
from phasegate.store import tables as t
from phasegate.store.users import TOKEN_PREFIX, UserNotFound, UserRefused
from phasegate.store.values import USER_ROLES
from phasegate.testing import FixedClock
from phasegate.web.auth import Role

from conftest import phasegate_cli


@pytest.fixture
def store(store_url: str) -> Store:
    s = open_store(store_url, FixedClock())
    yield s
    s.close()


def test_the_roles_the_store_takes_are_the_dashboards_in_its_order() -> None:
    assert tuple(r.value for r in Role) == USER_ROLES


def test_a_token_is_shown_once_and_kept_only_as_its_sha256(store: Store) -> None:
    row, token = store.add_user("alice", "approver", by="root")
    assert token.startswith(TOKEN_PREFIX) and len(token) == len(TOKEN_PREFIX) + 43
    assert (row["name"], row["role"], row["added_by"]) == ("alice", "approver", "root")
    assert "token_hash" not in row and token not in json.dumps(row, default=str)
    with store.engine.connect() as conn:
        kept = conn.execute(sa.select(t.users)).mappings().one()
    assert kept["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in json.dumps(dict(kept), default=str)

    found = store.user_for_token(token)
    assert found is not None and (found["name"], found["role"]) == ("alice", "approver")
    assert store.user_for_token(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert store.user_for_token("") is None
    _other, second = store.add_user("bob", "viewer", by="root")
    assert second != token
    assert [u["name"] for u in store.users()] == ["alice", "bob"]


def test_refusals_name_the_value_and_change_nothing(store: Store) -> None:
    store.add_user("alice", "admin", by="root")
    with pytest.raises(UserRefused, match="no role 'boss': give viewer, approver or admin"):
        store.add_user("bob", "boss", by="root")
    with pytest.raises(UserRefused, match="there is already a person named 'alice'"):
        store.add_user("alice", "viewer", by="root")
    with pytest.raises(UserRefused, match="the name ' carol'"):
        store.add_user(" carol", "viewer", by="root")
    with pytest.raises(UserRefused, match="slash or a control character"):
        store.add_user("a/b", "viewer", by="root")
    with pytest.raises(UserNotFound, match="there is no person named 'zed'"):
        store.set_role("zed", "viewer", by="root")
    with pytest.raises(UserRefused, match="there is no role 'root'"):
        store.set_role("alice", "root", by="root")
    assert [(u["name"], u["role"]) for u in store.users()] == [("alice", "admin")]


def test_the_last_admin_is_never_removed_nor_made_anything_else(store: Store) -> None:
    store.add_user("alice", "admin", by="root")
    store.add_user("bob", "approver", by="alice")
    with pytest.raises(UserRefused, match="'alice' is the last admin and cannot be removed"):
        store.remove_user("alice", by="alice")
    with pytest.raises(UserRefused, match="'alice' is the last admin and cannot be made viewer"):
        store.set_role("alice", "viewer", by="alice")
    assert store.user("alice")["role"] == "admin"

    changed = store.set_role("bob", "admin", by="alice")
    assert (changed["role"], changed["changed_by"]) == ("admin", "alice")
    removed = store.remove_user("alice", by="bob")
    assert (removed["removed_by"], removed["role"]) == ("bob", "admin")
    assert [u["name"] for u in store.users()] == ["bob"]


def test_two_admins_removed_at_once_leave_one(store: Store) -> None:
    # Each removal reads "another admin is left" and then writes: without the lock
    # both would read the other, and no admin would be left.
    store.add_user("alice", "admin", by="root")
    store.add_user("bob", "admin", by="root")
    start = threading.Barrier(2)
    refused: list[str] = []

    def remove(name: str) -> None:
        start.wait()
        try:
            store.remove_user(name, by="root")
        except UserRefused as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=remove, args=(n,)) for n in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 1 and "is the last admin" in refused[0]
    assert [u["role"] for u in store.users()] == ["admin"]


def test_a_new_token_voids_the_old_and_a_removed_persons_opens_nothing(store: Store) -> None:
    store.add_user("alice", "admin", by="root")
    _row, old = store.add_user("bob", "approver", by="alice")
    row, new = store.new_token("bob", by="alice")
    assert new != old and row["changed_by"] == "alice"
    assert store.user_for_token(old) is None
    assert store.user_for_token(new)["name"] == "bob"  # type: ignore[index]

    store.remove_user("bob", by="alice")
    assert store.user_for_token(new) is None
    with pytest.raises(UserNotFound):
        store.user("bob")
    assert not any(u["name"] == "bob" for u in store.users())
    gone = [u for u in store.users(removed=True) if u["name"] == "bob"]
    assert gone and gone[0]["removed_by"] == "alice" and gone[0]["removed_at"] is not None

    # The name may be taken again: the same row, a person again, with a new token.
    again, third = store.add_user("bob", "viewer", by="alice")
    assert (again["role"], again["removed_at"], again["changed_by"]) == ("viewer", None, None)
    assert store.user_for_token(third)["role"] == "viewer"  # type: ignore[index]
    assert store.user_for_token(new) is None


def test_has_users_counts_only_people_not_removed(store: Store) -> None:
    assert not store.has_users()
    store.add_user("alice", "viewer", by="root")
    assert store.has_users()
    store.remove_user("alice", by="root")
    assert not store.has_users()


# -- the command line -------------------------------------------------------------------


def test_users_add_prints_the_token_once_and_list_never_shows_it(happy_repo: Path) -> None:
    repo = str(happy_repo)
    added = phasegate_cli("users", "add", "alice", "--role", "admin", "--repo", repo)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()  # the token alone: `$(phasegate users add …)` takes it
    assert token.startswith(TOKEN_PREFIX) and "\n" not in token
    assert "added alice as admin" in added.stderr
    assert "Authorization: Bearer" in added.stderr and "shown once" in added.stderr

    listed = phasegate_cli("users", "list", "--repo", repo)
    assert listed.returncode == 0 and "alice" in listed.stdout and "admin" in listed.stdout
    as_json = phasegate_cli("users", "list", "--json", "--repo", repo)
    rows = json.loads(as_json.stdout)
    assert [(r["name"], r["role"], r["added_by"]) for r in rows] == [
        ("alice", "admin", login_name())
    ]
    assert token not in listed.stdout + as_json.stdout
    assert "token" not in rows[0] and "token_hash" not in rows[0]

    store = open_store(f"sqlite:///{happy_repo / '.phasegate' / 'state.db'}")
    try:
        assert store.user_for_token(token)["name"] == "alice"  # type: ignore[index]
    finally:
        store.close()


def test_users_refusals_name_the_value_in_text_and_in_json(happy_repo: Path) -> None:
    repo = str(happy_repo)
    phasegate_cli("users", "add", "alice", "--role", "admin", "--repo", repo)
    unknown = phasegate_cli("users", "add", "bob", "--role", "boss", "--repo", repo)
    assert unknown.returncode == 2 and "there is no role 'boss'" in unknown.stderr
    twice = phasegate_cli("users", "add", "alice", "--role", "viewer", "--json", "--repo", repo)
    assert twice.returncode == 2
    assert json.loads(twice.stdout)["error"] == {
        "message": "there is already a person named 'alice'",
        "kind": "UserRefused",
    }
    last = phasegate_cli("users", "remove", "alice", "--repo", repo)
    assert last.returncode == 2 and "'alice' is the last admin" in last.stderr
    nobody = phasegate_cli("users", "role", "zed", "viewer", "--json", "--repo", repo)
    assert nobody.returncode == 2
    assert "no person named 'zed'" in json.loads(nobody.stdout)["error"]["message"]
    listed = json.loads(phasegate_cli("users", "list", "--json", "--repo", repo).stdout)
    assert [(r["name"], r["role"]) for r in listed] == [("alice", "admin")]


def test_users_role_token_and_remove_record_who_did_it(happy_repo: Path) -> None:
    repo = str(happy_repo)
    phasegate_cli("users", "add", "alice", "--role", "admin", "--repo", repo)
    added = phasegate_cli("users", "add", "bob", "--json", "--by", "alice", "--repo", repo)
    first = json.loads(added.stdout)
    assert (first["role"], first["added_by"]) == ("viewer", "alice")  # the least, unless asked

    role = phasegate_cli("users", "role", "bob", "approver", "--by", "carol", "--repo", repo)
    assert role.returncode == 0 and "bob is now approver" in role.stdout
    renewed = phasegate_cli("users", "token", "bob", "--json", "--repo", repo)
    new = json.loads(renewed.stdout)
    assert new["token"].startswith(TOKEN_PREFIX) and new["token"] != first["token"]
    assert new["changed_by"] == login_name()
    removed = phasegate_cli("users", "remove", "bob", "--by", "alice", "--json", "--repo", repo)
    assert json.loads(removed.stdout)["removed_by"] == "alice"
    listed = phasegate_cli("users", "list", "--removed", "--json", "--repo", repo)
    everyone = json.loads(listed.stdout)
    assert [(r["name"], r["removed_by"]) for r in everyone] == [("alice", None), ("bob", "alice")]
