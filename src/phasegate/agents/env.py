"""What of phasegate's environment an agent process may see, and keeping keys out of records.

An agent gets PATH and the locale, what its role binding names (``env``,
``pass_env``, ``api_key_env``) and what its runner sets (an isolated HOME, the
model's base URL). Nothing else: a GITHUB_TOKEN or another provider's key in
phasegate's environment never reaches an agent unless the cartridge says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from phasegate.cartridge import RoleBinding

__all__ = ["BASE_ENV", "child_env", "redact", "secret_values"]

#: Always passed through: what any program needs to run and read text.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM")

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)
_MIN_SECRET = 8  # shorter values would redact ordinary words


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


def secret_values(binding: RoleBinding, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values an agent of ``binding`` may hold that must never be recorded."""
    source = os.environ if environ is None else environ
    names = {name for name in source if _SECRET_NAME.search(name)}
    if binding.api_key_env:
        names.add(binding.api_key_env)
    values = [source[n] for n in names if n in source]
    values += [v for k, v in binding.env.items() if _SECRET_NAME.search(k)]
    return sorted({v for v in values if len(v) >= _MIN_SECRET}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
