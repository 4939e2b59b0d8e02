"""What of phasegate's environment an agent process may see, and keeping keys out of records.

An agent gets PATH and the locale, what its role binding names (``env``,
``pass_env``, ``api_key_env``) and what its runner sets (an isolated HOME, the
model's base URL). Nothing else: a GITHUB_TOKEN or another provider's key in
phasegate's environment never reaches an agent unless the cartridge says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from phasegate.config.cartridge import Cartridge, RoleBinding
from phasegate.core.redaction import (
    MIN_SECRET,
    SECRET_NAME,
    files_with_secrets,
    holds_secret,
    redact,
    secret_set,
    secret_variants,
    secrets_in_environment,
)

__all__ = [
    "BASE_ENV",
    "CHECK_ENV",
    "cartridge_secrets",
    "check_env",
    "child_env",
    "environment_secrets",
    "files_with_secrets",
    "holds_secret",
    "redact",
    "secret_names_in",
    "secret_values",
    "secret_variants",
]

#: Always passed through: what any program needs to run and read text.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM")

_MIN_SECRET = MIN_SECRET


def child_env(
    binding: RoleBinding,
    base: Iterable[str] = BASE_ENV,
    extra: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an agent process for ``binding``.

    ``base`` names variables passed through as they are; ``extra`` is what the
    runner sets itself. The binding's ``env`` values win over everything.
    """
    source = os.environ if environ is None else environ
    names = [*base, *binding.pass_env]
    if binding.api_key_env:
        names.append(binding.api_key_env)
    env = {name: source[name] for name in names if name in source}
    return {**env, **(extra or {}), **binding.env}


#: What a check command sees besides BASE_ENV: a test suite needs a home and its
#: interpreter's environment, never a key (``landing_areas.pass_env`` adds names).
CHECK_ENV = (*BASE_ENV, "HOME", "USER", "SHELL", "VIRTUAL_ENV", "PYTHONPATH")


def check_env(
    pass_env: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a check command: CHECK_ENV and the names in ``pass_env``."""
    source = os.environ if environ is None else environ
    return {name: source[name] for name in (*CHECK_ENV, *pass_env) if name in source}


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every value in the environment held by a variable whose name says it is secret."""
    return secrets_in_environment(os.environ if environ is None else environ)


def secret_names_in(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The names of the secret-named variables whose values occur in ``text``, raw or
    encoded (``phasegate.core.redaction.secret_variants``)."""
    source = os.environ if environ is None else environ
    return sorted(
        name
        for name, value in source.items()
        if SECRET_NAME.search(name) and len(value) >= _MIN_SECRET and holds_secret(text, [value])
    )


def secret_values(binding: RoleBinding, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values an agent of ``binding`` may hold that must never be recorded."""
    source = os.environ if environ is None else environ
    values = environment_secrets(source)
    if binding.api_key_env and binding.api_key_env in source:
        values.append(source[binding.api_key_env])
    values += [v for k, v in binding.env.items() if SECRET_NAME.search(k)]
    return secret_set(values)


def cartridge_secrets(cartridge: Cartridge, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every value no record may hold: ``environment_secrets`` and the secret values
    of every bound role (``secret_values``). A record one role's agent writes may
    quote what another role's agent holds (a review of a change, a PR body). The
    forge's token (``forge.token_env``) and the sign-on's client secret
    (``dashboard.oidc.client_secret_env``) too, whatever their variables are called."""
    source = os.environ if environ is None else environ
    values = environment_secrets(source)
    if cartridge.forge.kind != "local" and source.get(cartridge.forge.token_env):
        values.append(source[cartridge.forge.token_env])
    sign_on = cartridge.dashboard.oidc
    if sign_on is not None and source.get(sign_on.client_secret_env or ""):
        values.append(source[sign_on.client_secret_env or ""])
    for name in type(cartridge.roles).model_fields:
        binding = getattr(cartridge.roles, name)
        if binding is not None:
            values += secret_values(binding, source)
    return secret_set(values)
