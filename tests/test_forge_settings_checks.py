"""The [forge] table's checks that hold for every remote forge: a base_url that
would send the token in the clear, an API root given for GitLab's or Gitea's
instance, and a GitHub App's key given to another forge, each refused naming
the key the cartridge holds; the help and the reference name every forge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from phasegate.config.forge import ForgeSettings

from conftest import phasegate_cli


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_plain_http_to_another_machine_is_refused_for_every_forge(kind: str) -> None:
    for url in ("http://gitlab.example.com", "http://10.0.0.5:8080/api/v3"):
        with pytest.raises(ValidationError, match=r"forge.base_url: .* is not https"):
            ForgeSettings(kind=kind, repository="octo/widgets", base_url=url)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="forge.base_url: it holds credentials"):
        ForgeSettings(kind=kind, repository="octo/widgets", base_url="https://me:pw@h.example")  # type: ignore[arg-type]
    for url in (
        "http://127.0.0.1:8128",
        "http://localhost:3000",
        "http://[::1]:9",
        "https://h.example",
    ):
        assert ForgeSettings(kind=kind, repository="octo/widgets", base_url=url).base_url == url  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "url", "example"),
    [
        ("gitlab", "https://gitlab.example.com/api/v4", "https://gitlab.example.com"),
        ("gitlab", "https://example.com/gitlab/api/v4/", "https://gitlab.example.com"),
        ("gitea", "https://git.example.com/api/v1", "https://git.example.com"),
    ],
)
def test_an_api_root_where_the_instance_is_wanted_is_refused(
    kind: str, url: str, example: str
) -> None:
    with pytest.raises(ValidationError, match="forge.base_url: .* is the API root") as caught:
        ForgeSettings(kind=kind, repository="octo/widgets", base_url=url)  # type: ignore[arg-type]
    assert f"give the instance's URL (e.g. {example})" in str(caught.value)


def test_github_enterprise_keeps_its_api_root() -> None:
    url = "https://ghe.example.com/api/v3"
    assert ForgeSettings(kind="github", base_url=url).base_url == url


@pytest.mark.parametrize("kind", ["gitlab", "gitea"])
@pytest.mark.parametrize("key", ["private_key_file", "installation_id"])
def test_a_github_app_key_given_to_another_forge_is_named(kind: str, key: str) -> None:
    value: object = "app.pem" if key == "private_key_file" else 7
    with pytest.raises(ValidationError, match=f"forge.{key}: a GitHub App is GitHub's"):
        ForgeSettings(
            kind=kind, repository="octo/widgets", base_url="https://h.example", **{key: value}
        )  # type: ignore[arg-type]


def test_the_help_and_the_reference_name_every_forge() -> None:
    doctor = phasegate_cli("doctor", "--help", env={**os.environ, "COLUMNS": "200"})
    assert doctor.returncode == 0, doctor.stderr
    said = " ".join(doctor.stdout.split())
    assert "Send nothing to GitHub" not in said and 'forge.kind = "gitea"' in said
    watch = " ".join(
        phasegate_cli("watch", "--help", env={**os.environ, "COLUMNS": "200"}).stdout.split()
    )
    assert '"gitea"' in watch
    reference = (Path(__file__).parent.parent / "docs" / "reference" / "cartridge.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `token_env`"))
    assert "| by kind |" in row and '"GITHUB_TOKEN"' not in row
    for key in ("merge_method", "delete_merged_branches"):
        row = next(line for line in reference.splitlines() if line.startswith(f"| `{key}`"))
        assert "GitHub" not in row, row
