"""Single sign-on in a real Chromium: a person clicks "Sign in with …" on the
dashboard's login page, signs in at a real OpenID Connect provider
(node-oidc-provider, support.oidc) on another site (``localhost`` against the
dashboard's ``127.0.0.1``, so the browser's SameSite rules apply as with a real
provider), and lands on the board as the role their ``groups`` claim maps to: a
viewer's action is refused, an approver's is taken.

``phasegate serve``'s machinery (``Dashboard``) on a free port. Missing Chromium,
Playwright, node or the oidc-provider package fails these under CI or
PHASEGATE_BROWSER=required, skips them elsewhere.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phasegate.web import Access
from phasegate.web.serve import Dashboard

from conftest import git, make_repo, scripted_cartridge
from support.oidc import (
    CLIENT_ID,
    CLIENT_SECRET,
    OidcProvider,
    ProviderUnavailable,
    find_provider,
    provider_required,
)

pytest_plugins = ("support.browser",)

SECRET_ENV = "PHASEGATE_TEST_OIDC_SECRET"
#: Seconds Playwright waits for a page to show what it must.
SHOWN_S = 30


@dataclass
class SignOnSite:
    url: str
    provider: OidcProvider


@pytest.fixture
def site(tmp_path: Path, engine_for: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[SignOnSite]:
    """A dashboard (no worker) whose [dashboard.oidc] names a provider started for it."""
    try:
        find_provider()
    except ProviderUnavailable as missing:
        if provider_required():
            pytest.fail(f"the sign-on browser test needs a real provider: {missing}")
        pytest.skip(str(missing))
    with socket.socket() as probe:  # the callback is registered at the provider first
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    callback = f"http://127.0.0.1:{port}/login/oidc/callback"
    with OidcProvider([callback]) as provider:
        monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
        table = (
            f'[dashboard.oidc]\nissuer = "{provider.issuer}"\nclient_id = "{CLIENT_ID}"\n'
            f'client_secret_env = "{SECRET_ENV}"\nscopes = ["openid", "profile", "groups"]\n'
            'label = "Team SSO"\n'
            '[dashboard.oidc.roles]\n"phasegate-approvers" = "approver"\n"staff" = "viewer"\n'
        )
        repo = make_repo(
            tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"}
        )
        (repo / "answers.toml").write_text("")
        (repo / "phasegate.toml").write_text(scripted_cartridge(extra=table))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "cartridge")
        engine = engine_for(repo)[0]
        access = Access(token="sign-on-browser-token-0123456789", user="owner")
        dashboard = Dashboard(engine, access, port=port, worker=False)
        url = dashboard.start()
        try:
            yield SignOnSite(url, provider)
        finally:
            dashboard.stop()
        assert dashboard.errors == []


def sign_in(page: Any, site: SignOnSite, login: str, expect: Any) -> None:
    """From the dashboard's login page through the provider's pages, back to the board."""
    page.goto(f"{site.url}/")
    expect(page.locator("#sign-on")).to_have_text("Sign in with Team SSO")
    page.click("#sign-on")
    page.wait_for_url(re.compile(re.escape(site.provider.issuer) + "/interaction/"))
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(site.provider.issuer) + "/interaction/"))
    page.click("button[type=submit]")  # the consent page
    page.wait_for_url(f"{site.url}/")


def post_ticket(page: Any, site: SignOnSite) -> int:
    """A ticket posted with the page's session and CSRF token, as its form would: the status."""
    headers = page.locator("body").get_attribute("hx-headers")
    csrf = re.search(r'"X-CSRF-Token": "([^"]+)"', headers or "")
    assert csrf, headers
    answer = page.context.request.post(
        f"{site.url}/tickets",
        form={"ticket": "Write feature.txt"},
        headers={"X-CSRF-Token": csrf.group(1)},
        max_redirects=0,
    )
    return answer.status


def test_an_oidc_login_maps_to_its_role_in_a_real_browser(
    chromium_browser: Any, site: SignOnSite
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=SHOWN_S * 1000)
    viewer, approver = chromium_browser.new_context(), chromium_browser.new_context()
    try:
        vera = viewer.new_page()
        sign_in(vera, site, "vera", expect)
        expect(vera.locator("#user")).to_have_text("vera")
        assert post_ticket(vera, site) == 403  # a viewer sees, never acts

        alice = approver.new_page()
        sign_in(alice, site, "alice", expect)
        expect(alice.locator("#user")).to_have_text("alice")
        assert post_ticket(alice, site) == 303  # an approver's ticket is filed
        # The session is the browser's own: reloading keeps it, no token was ever given.
        alice.reload()
        expect(alice.locator("#user")).to_have_text("alice")
    finally:
        viewer.close()
        approver.close()
