"""The cartridge's ``[queue]`` table: caps on agent calls at once, and which provider
a role's calls go to.

Split out of cartridge.py, which re-exports it (docs/queues.md says how the
caps, and the shared store's own, are held across workers).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from phasegate.config.agents import RUNNERS, RoleBinding

__all__ = ["RUNNER_PROVIDERS", "QueueSettings", "provider_of"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "yes" is not a bool


#: The model provider of each agent CLI that talks to one vendor's models, when the
#: binding's model names none (``provider_of``).
RUNNER_PROVIDERS = {
    "claude-code": "anthropic",
    "codex": "openai",
    "gemini": "google",
    "qwen": "qwen",
    "copilot": "github",
}


def provider_of(binding: RoleBinding) -> str:
    """The model provider a role's calls count against: the prefix of its ``model``
    before the first ``/`` (``anthropic/claude-sonnet-4`` → ``anthropic``), else the
    vendor of its runner (``RUNNER_PROVIDERS``: claude-code → anthropic), else the
    runner's name (``command``, ``api`` with an unprefixed model), lower-cased."""
    model = (binding.model or "").strip()
    if "/" in model and model.split("/", 1)[0].strip():
        return model.split("/", 1)[0].strip().lower()
    return RUNNER_PROVIDERS.get(binding.runner, binding.runner).lower()


class QueueSettings(_Strict):
    """``[queue]``: the most agent calls running at once, held across every worker that
    shares the store (docs/queues.md). A call counts against its model provider's
    cap, its runner's and its repository's, and waits, its workflow keeping its
    lease, until each has a free slot. The provider is the prefix of the role's
    model before its first ``/`` (``anthropic/claude-sonnet-4``: anthropic), else
    the runner's vendor (claude-code: anthropic, codex: openai, gemini: google,
    qwen: qwen, copilot: github), else the runner's name (command, api, aider).
    The shared store may hold caps too (``phasegate queue cap``): for one scope
    and name, the smaller cap holds."""

    max_calls_per_provider: dict[str, int] = Field(default_factory=dict)
    """The most calls at once to each model provider named, e.g. {anthropic = 3}; "*" caps
    each provider not named. A provider is the part of a model's name before its first
    "/", so a name holding "/" is refused."""
    max_calls_per_runner: dict[str, int] = Field(default_factory=dict)
    """The most calls at once by each runner named, e.g. {claude-code = 2}; "*" caps each
    runner not named. A name that is no runner is refused."""
    max_calls_per_repository: int | None = Field(default=None, ge=1)
    """The most calls at once for this repository's workflows, by every worker; unset: no cap."""
    slot_poll_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds between a waiting call's looks at the slots when no wake-up came."""

    @field_validator("max_calls_per_provider", "max_calls_per_runner")
    @classmethod
    def _positive(cls, caps: dict[str, int]) -> dict[str, int]:
        for key, cap in caps.items():
            if not key.strip():
                raise ValueError('a cap needs a name (or "*" for each one not named)')
            if cap < 1:
                raise ValueError(f"{key} = {cap}: a cap is at least 1 call at once")
        return {key.strip().lower(): cap for key, cap in caps.items()}

    @field_validator("max_calls_per_provider")
    @classmethod
    def _providers(cls, caps: dict[str, int]) -> dict[str, int]:
        for key in caps:
            if "/" in key:
                raise ValueError(
                    f"{key!r}: a provider is the part of a model's name before its first / "
                    f"(give {key.split('/', 1)[0]!r})"
                )
        return caps

    @field_validator("max_calls_per_runner")
    @classmethod
    def _runners(cls, caps: dict[str, int]) -> dict[str, int]:
        for key in caps:
            if key != "*" and key not in RUNNERS:
                raise ValueError(f"{key!r} is no runner: give one of {', '.join(RUNNERS)}, or *")
        return caps
