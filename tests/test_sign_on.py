"""Single sign-on through OpenID Connect, over HTTP: the dashboard (FastAPI's
TestClient on a real store) against a real provider, node-oidc-provider, started
here (support.oidc). A person signs in at the provider and gets the role their
``groups`` claim maps to; a callback this browser did not start, a claim that maps
to no role, a provider that names another issuer, is down or says no, opens no
session. The ID token's checks (issuer, audience, nonce, signature, times) are
also held to tokens signed here, where each can be made wrong on purpose. A bad
``[dashboard.oidc]`` table is refused naming its key.

Without node or the oidc-provider package these skip, except under CI or
PHASEGATE_BROWSER=required, where they fail.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from phasegate.agents.env import cartridge_secrets
from phasegate.config.cartridge import CartridgeError, cartridge_from_document
from phasegate.config.dashboard import OidcSettings
from phasegate.config.toml import read_toml
from phasegate.runtime.engine import Engine
from phasegate.web import Access, create_app
from phasegate.web.auth import SESSION_COOKIE, Person, Role
from phasegate.web.oidc import SignOnFailed, person_from_claims, verify_id_token

from conftest import git, make_repo, scripted_cartridge
from support.oidc import (
    CLIENT_ID,
    CLIENT_SECRET,
    OidcProvider,
    ProviderUnavailable,
    find_provider,
    provider_required,
    sign_in_over_http,
)

TOKEN = "sign-on-test-token-0123456789"
SECRET_ENV = "PHASEGATE_TEST_OIDC_SECRET"
CALLBACK = "http://testserver/login/oidc/callback"
ISSUER = "https://sso.example.com"  # of the tokens signed here
ROLES = """
[dashboard.oidc.roles]
"phasegate-admins" = "admin"
"phasegate-approvers" = "approver"
"staff" = "viewer"
"""


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    try:
        find_provider()
    except ProviderUnavailable as missing:
        if provider_required():
            pytest.fail(f"the sign-on tests need a real provider: {missing}")
        pytest.skip(str(missing))
    with OidcProvider([CALLBACK]) as running:
        yield running


def oidc_table(issuer: str, extra: str = "") -> str:
    return (
        f'[dashboard.oidc]\nissuer = "{issuer}"\nclient_id = "{CLIENT_ID}"\n'
        f'client_secret_env = "{SECRET_ENV}"\nscopes = ["openid", "profile", "groups"]\n'
        f'label = "Test SSO"\n{extra}{ROLES}'
    )


def dashboard_for(tmp_path: Path, engine_for: Any, table: str) -> tuple[TestClient, Access]:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text("")
    (repo / "phasegate.toml").write_text(scripted_cartridge(extra=table))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine: Engine = engine_for(repo)[0]
    access = Access(token=TOKEN, user="owner")
    return TestClient(create_app(engine, access)), access


@pytest.fixture
def signed_on(
    tmp_path: Path, engine_for: Any, provider: OidcProvider, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, Access]]:
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    client, access = dashboard_for(tmp_path, engine_for, oidc_table(provider.issuer))
    with client:
        yield client, access


def come_back(client: TestClient, login: str, *, cancel: bool = False) -> str:
    """The callback URL (on the dashboard) the provider sends ``login`` back to."""
    started = client.get("/login/oidc", follow_redirects=False)
    assert started.status_code == 303, started.text
    with httpx.Client(timeout=30) as browser:
        back = sign_in_over_http(browser, started.headers["location"], login, cancel=cancel)
    assert back.startswith(CALLBACK), back
    return back.removeprefix("http://testserver")


def sign_in(client: TestClient, login: str) -> httpx.Response:
    return client.get(come_back(client, login), follow_redirects=False)


def person_of(client: TestClient, access: Access) -> Person | None:
    session = access.session(client.cookies.get(SESSION_COOKIE))
    return None if session is None else session.person


@pytest.mark.parametrize(
    ("login", "role"), [("alice", Role.APPROVER), ("vera", Role.VIEWER), ("ada", Role.ADMIN)]
)
def test_a_sign_on_opens_a_session_with_the_role_the_claim_maps_to(
    signed_on: tuple[TestClient, Access], login: str, role: Role
) -> None:
    client, access = signed_on
    assert client.get("/").status_code == 401
    assert 'id="sign-on"' in client.get("/login").text
    answer = sign_in(client, login)
    assert answer.status_code == 200, answer.text
    assert f"Signed in as {login} ({role.value})" in answer.text
    assert 'http-equiv="refresh" content="0;url=/"' in answer.text
    assert person_of(client, access) == Person(login, role)
    board = client.get("/")
    assert board.status_code == 200 and f'id="user">{login}<' in board.text


def test_a_viewer_who_signed_on_cannot_act(signed_on: tuple[TestClient, Access]) -> None:
    client, access = signed_on
    sign_in(client, "vera")
    session = access.session(client.cookies.get(SESSION_COOKIE))
    assert session is not None
    refused = client.post("/tickets", data={"ticket": "do it", "csrf": session.csrf})
    assert refused.status_code == 403
    assert "viewer" in refused.json()["detail"]


def test_a_claim_that_maps_to_no_role_opens_no_session(
    signed_on: tuple[TestClient, Access],
) -> None:
    client, access = signed_on
    answer = sign_in(client, "otto")
    assert answer.status_code == 403
    assert "no value of the groups claim (contractors) gives a role" in answer.text
    assert SESSION_COOKIE not in answer.cookies and person_of(client, access) is None
    assert client.get("/").status_code == 401


def test_a_callback_this_browser_did_not_start_opens_nothing(
    signed_on: tuple[TestClient, Access],
) -> None:
    client, access = signed_on
    back = come_back(client, "alice")
    # Another browser (no state cookie) follows the same link: a login forced on it.
    with TestClient(client.app) as stranger:
        refused = stranger.get(back, follow_redirects=False)
        assert refused.status_code == 400
        assert "not started in this browser" in refused.text
        assert SESSION_COOKIE not in refused.cookies
    # A state changed on the way: refused too.
    tampered = back.replace("state=", "state=x")
    assert client.get(tampered, follow_redirects=False).status_code == 400
    assert person_of(client, access) is None
    # Neither spent the person's own sign-on.
    assert client.get(back, follow_redirects=False).status_code == 200
    assert person_of(client, access) == Person("alice", Role.APPROVER)


def test_a_state_is_used_once(signed_on: tuple[TestClient, Access]) -> None:
    client, access = signed_on
    back = come_back(client, "alice")
    state_cookie = dict(client.cookies)
    assert client.get(back, follow_redirects=False).status_code == 200
    client.cookies.clear()
    client.cookies.update(state_cookie)
    again = client.get(back, follow_redirects=False)
    assert again.status_code == 400 and "used already" in again.text


def test_a_person_who_cancels_at_the_provider_opens_no_session(
    signed_on: tuple[TestClient, Access],
) -> None:
    client, access = signed_on
    answer = client.get(come_back(client, "alice", cancel=True), follow_redirects=False)
    assert answer.status_code == 403
    assert "Test SSO did not sign you in: End-User aborted interaction" in answer.text
    assert person_of(client, access) is None


def test_a_provider_that_changed_its_key_is_read_again(
    tmp_path: Path, engine_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    with OidcProvider([CALLBACK]) as first:
        port = int(first.issuer.rsplit(":", 1)[1])
        client, access = dashboard_for(tmp_path, engine_for, oidc_table(first.issuer))
        with client:
            assert sign_in(client, "alice").status_code == 200
    # The same provider restarted with a new signing key: the kept keys do not know it.
    with OidcProvider([CALLBACK], port=port), client:
        client.cookies.clear()
        answer = sign_in(client, "ada")
        assert answer.status_code == 200, answer.text
        assert person_of(client, access) == Person("ada", Role.ADMIN)


def test_a_provider_that_names_another_issuer_is_refused(
    tmp_path: Path, engine_for: Any, provider: OidcProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    # The same provider by another name: its discovery document says "localhost".
    other_name = provider.issuer.replace("localhost", "127.0.0.1")
    client, _ = dashboard_for(tmp_path, engine_for, oidc_table(other_name))
    with client:
        answer = client.get("/login/oidc", follow_redirects=False)
    assert answer.status_code == 502
    assert f"names the issuer &#39;{provider.issuer}&#39;" in answer.text
    assert "dashboard.oidc.issuer" in answer.text


def test_a_provider_that_is_down_gets_a_clear_page(
    tmp_path: Path, engine_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    client, access = dashboard_for(tmp_path, engine_for, oidc_table(f"http://127.0.0.1:{closed}"))
    with client:
        answer = client.get("/login/oidc", follow_redirects=False)
        assert answer.status_code == 502
        assert "Test SSO could not be reached for its configuration" in answer.text
        assert client.get("/login").status_code == 200  # the token still lets people in


def test_the_role_claim_may_be_nested_one_value_or_absent() -> None:
    settings = OidcSettings(
        issuer=ISSUER,
        client_id=CLIENT_ID,
        role_claim="realm_access.roles",
        roles={"dev": "approver", "ops": "admin"},
        name_claim="email",
    )
    nested = {"email": "a@example.test", "realm_access": {"roles": ["dev", "ops", "x"]}}
    assert person_from_claims(settings, nested) == Person("a@example.test", Role.ADMIN)
    flat = {"email": "b@example.test", "realm_access.roles": "dev"}  # a claim named with a dot
    assert person_from_claims(settings, flat) == Person("b@example.test", Role.APPROVER)
    with pytest.raises(SignOnFailed, match=r"realm_access.roles claim \(none\)") as refused:
        person_from_claims(settings, {"email": "c@example.test"})
    assert refused.value.status == 403
    everyone = settings.model_copy(update={"default_role": "viewer"})
    assert person_from_claims(everyone, {"email": "c@example.test"}).role is Role.VIEWER
    with pytest.raises(SignOnFailed, match="no email claim"):
        person_from_claims(everyone, {"sub": "u1"})
    # A name no action could record is refused at the door, not on every click after.
    long_name = "x" * 70 + "@example.test"
    with pytest.raises(SignOnFailed, match="email claim cannot name a person here"):
        person_from_claims(everyone, {"email": long_name})
    with pytest.raises(SignOnFailed, match="control character"):
        person_from_claims(everyone, {"email": "eve\n@example.test"})


# -- the ID token's checks, on tokens signed here -----------------------------------


@pytest.fixture(scope="module")
def key() -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"})


def id_token(key: RSAKey, **changes: Any) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": "u1",
        "aud": CLIENT_ID,
        "exp": now + 300,
        "iat": now,
        "nonce": "n1",
        **changes,
    }
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)


def verified(token: str, keys: KeySet) -> dict[str, Any]:
    return verify_id_token(
        token, keys, issuer=ISSUER, client_id=CLIENT_ID, nonce="n1", algorithms=["RS256"]
    )


def test_a_well_formed_id_token_verifies(key: RSAKey) -> None:
    keys = KeySet([RSAKey.import_key(key.as_dict(private=False))])
    assert verified(id_token(key), keys)["sub"] == "u1"
    assert verified(id_token(key, aud=[CLIENT_ID]), keys)["sub"] == "u1"


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"iss": "https://evil.example.com"}, "iss"),
        ({"aud": "another-app"}, "aud"),
        ({"aud": ["another-app", CLIENT_ID], "azp": "another-app"}, "azp"),
        ({"nonce": "replayed"}, "nonce"),
        ({"exp": int(time.time()) - 3600}, "expired"),
    ],
)
def test_an_id_token_for_someone_else_is_refused(
    key: RSAKey, changes: dict[str, Any], said: str
) -> None:
    keys = KeySet([RSAKey.import_key(key.as_dict(private=False))])
    with pytest.raises(SignOnFailed, match=said) as refused:
        verified(id_token(key, **changes), keys)
    assert refused.value.status == 403


def test_an_id_token_signed_by_another_key_or_none_is_refused(key: RSAKey) -> None:
    keys = KeySet([RSAKey.import_key(key.as_dict(private=False))])
    forger = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    with pytest.raises(SignOnFailed, match="signature"):
        verified(id_token(forger), keys)
    header, claims, _ = id_token(key).split(".")
    unsigned = ".".join(["eyJhbGciOiJub25lIn0", claims, ""])  # {"alg":"none"}
    with pytest.raises(SignOnFailed, match="signature"):
        verified(unsigned, keys)


# -- the table -------------------------------------------------------------------------


def table_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "phasegate.toml"
    path.write_text(text)
    with pytest.raises(CartridgeError) as refused:
        cartridge_from_document(tmp_path, read_toml(path))
    return str(refused.value)


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (
            oidc_table("http://sso.example.com"),
            "dashboard.oidc.issuer: 'http://sso.example.com' is not https",
        ),
        (
            oidc_table("https://sso.example.com").replace('"openid", ', ""),
            "dashboard.oidc.scopes: openid must be one of them",
        ),
        (
            oidc_table("https://sso.example.com", 'client_secret = "hunter2"\n'),
            "dashboard.oidc.client_secret: unknown key",
        ),
        (
            '[dashboard.oidc]\nissuer = "https://sso.example.com"\nclient_id = "x"\n',
            "dashboard.oidc.roles: no value of the role claim gives a role",
        ),
        (
            oidc_table("https://sso.example.com").replace(SECRET_ENV, "s3cr3t value"),
            "dashboard.oidc.client_secret_env",
        ),
        (
            oidc_table("https://sso.example.com") + '"x" = "owner"\n',
            "dashboard.oidc.roles.x",
        ),
    ],
)
def test_a_bad_table_is_refused_naming_its_key(tmp_path: Path, table: str, said: str) -> None:
    assert said in table_error(tmp_path, table)


def test_an_unset_secret_variable_stops_the_dashboard_naming_it(
    tmp_path: Path, engine_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(CartridgeError, match=f"dashboard.oidc.client_secret_env: .*{SECRET_ENV}"):
        dashboard_for(tmp_path, engine_for, oidc_table("https://sso.example.com"))


def test_the_client_secret_is_one_no_page_or_record_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "phasegate.toml"
    path.write_text(oidc_table("https://sso.example.com").replace(SECRET_ENV, "ODD_NAME"))
    cartridge = cartridge_from_document(tmp_path, read_toml(path))
    # A name no secret-looking pattern catches: the table's key is what says it is one.
    assert "tall-horse-staple-battery" in cartridge_secrets(
        cartridge, {"ODD_NAME": "tall-horse-staple-battery"}
    )


def test_without_the_table_there_is_no_sign_on(tmp_path: Path, engine_for: Any) -> None:
    client, _ = dashboard_for(tmp_path, engine_for, "")
    with client:
        assert 'id="sign-on"' not in client.get("/login").text
        assert client.get("/login/oidc", follow_redirects=False).status_code == 404
