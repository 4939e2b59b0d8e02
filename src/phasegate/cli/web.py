"""The dashboard's commands: ``serve`` (phasegate.web) and ``events`` (its live
stream in a terminal)."""

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from phasegate.cli._app import (
    STOP_SIGNALS,
    JsonOption,
    RepoOption,
    app,
    console,
    err,
    open_for_reading,
    open_repo,
    repo_root,
    reported_errors,
    shown,
)
from phasegate.runtime import DEFAULT_CONCURRENCY


@app.command()
def serve(
    repo: RepoOption = Path("."),
    host: Annotated[
        str,
        typer.Option(
            help="The address to listen on. Default 127.0.0.1: only this machine; from "
            "another, go through an SSH tunnel or a TLS reverse proxy (docs/dashboard.md)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="The port (0: any free one).")] = 8765,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-j", min=1, help="Workflows the worker advances at once."),
    ] = DEFAULT_CONCURRENCY,
    no_worker: Annotated[
        bool,
        typer.Option("--no-worker", help="Serve only; another `phasegate worker` advances."),
    ] = False,
    metrics: Annotated[
        str,
        typer.Option(
            "--metrics",
            envvar="PHASEGATE_METRICS",
            help="Who reads /metrics (Prometheus): token (a bearer token or a session, as "
            "every page), local (that, or any client on this machine without one; not "
            "behind a reverse proxy on this machine), off.",
        ),
    ] = "token",
) -> None:
    """Serve the dashboard on 127.0.0.1:8765 and run the worker.

    The board (needs you first) and each workflow's page, both live. Every
    request needs a token: a person's own (`phasegate users add NAME --role
    viewer|approver|admin`; viewers see, approvers decide, admins also manage
    people), or PHASEGATE_WEB_TOKEN (an admin recorded as PHASEGATE_WEB_USER,
    default your OS user); with neither, one is made now and printed with the
    login URL. It is exchanged once for a session cookie, and every action
    carries a CSRF token and is recorded under the person's name. Ctrl-C stops
    both; each workflow stays resumable.

    Scripts use the JSON API under /api with `Authorization: Bearer TOKEN`: every
    read and every decision, described at /openapi.json (docs/api.md).

    A team forge's webhooks are taken at /webhooks/github (gitlab, gitea),
    verified with the secret in PHASEGATE_WEBHOOK_SECRET (docs/webhooks.md).
    With a [dashboard.oidc] table, people may also sign in through an OpenID
    Connect provider, their role taken from a claim (docs/sign-on.md).
    /metrics gives the store's figures to Prometheus (docs/operations-at-scale.md).
    """
    if metrics not in _METRICS_MODES:
        raise typer.BadParameter(
            f"{metrics!r} is not one of {', '.join(_METRICS_MODES)}", param_hint="--metrics"
        )
    from phasegate.cli._watching import watch_in_worker
    from phasegate.cli.render import graceful, make_engine, worker_notice
    from phasegate.integrations import notify

    # Imported here: the web app reads through cli.render, and every other command
    # starts without loading FastAPI.
    from phasegate.web.auth import Access
    from phasegate.web.serve import Dashboard

    with reported_errors():
        root, cartridge, store = open_repo(repo)
        engine = make_engine(root, cartridge, store, None)
        access = Access(store=store)
        if not no_worker:
            notify.catch_up(engine)  # what a killed process left unsent, as `worker` does
        dashboard = Dashboard(
            engine,
            access,
            host,
            port,
            concurrency=concurrency,
            worker=not no_worker,
            metrics=metrics,
        )
        notice = (
            (lambda: "stopping the dashboard") if no_worker else (lambda: worker_notice(engine))
        )
        with graceful(engine, notice=notice):
            try:
                url = dashboard.start()
            except OSError as exc:
                raise typer.Exit(_said(f"cannot listen on {host}:{port}: {exc}")) from None
            for line in login_lines(access, url):
                err.print(line, highlight=False)
            sign_on = cartridge.dashboard.oidc
            if sign_on is not None:
                err.print(
                    f"single sign-on: {shown(sign_on.shown_label)} ({shown(sign_on.issuer)}), "
                    "from the login page",
                    highlight=False,
                )
            if host not in _LOOPBACK:
                err.print(
                    f"[yellow]warning:[/yellow] listening on {shown(host)}: other machines "
                    "reach it, over plain HTTP (the token and the session cookie in clear "
                    "text); an SSH tunnel or a TLS reverse proxy in front of 127.0.0.1 "
                    "does not expose them",
                    highlight=False,
                )
            # As `phasegate worker` does: the forge's labelled issues filed as tickets.
            watch = (
                watch_in_worker(root, cartridge, engine, once=False, say=_say_line)
                if not no_worker
                else contextlib.nullcontext()
            )
            with watch:
                dashboard.wait()
    if dashboard.errors:
        raise typer.Exit(_said(f"the worker stopped: {dashboard.errors[0]}", 1))
    raise typer.Exit(130 if engine.shutdown.is_set() else 0)


def login_lines(access: Any, url: str) -> list[str]:
    """What ``serve`` says at start about logging in (``access``: its ``Access``)."""
    from phasegate.web.auth import TOKEN_VARIABLE, USER_VARIABLE

    people = "personal tokens: `phasegate users add NAME --role viewer|approver|admin`"
    if access.token is None:  # people in the store, no token of the environment's
        return [
            f"phasegate serve: {url} (log in with your personal token; {people})",
            "actions are recorded under the name of the person who logs in",
        ]
    where = "the token in " + TOKEN_VARIABLE if not access.made_token else "this token"
    lines = [f"phasegate serve: {url} (as {shown(access.user)}, an admin; {where}; {people})"]
    if access.made_token:
        # The one place the token is shown: the terminal of who started it.
        lines.append(f"log in at {url}/login?token={access.token}")
    lines.append(
        f"this token's actions are recorded as {shown(access.user)} ({USER_VARIABLE} to change)"
    )
    return lines


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: web.metrics.METRICS_MODES, named here: the web app loads only when serve runs.
_METRICS_MODES = ("token", "local", "off")


def _said(message: str, code: int = 2) -> int:
    err.print(f"[red]error:[/red] {shown(message)}", highlight=False)
    return code


@app.command()
def events(
    workflow_id: Annotated[str, typer.Argument(metavar="ID")],
    repo: RepoOption = Path("."),
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    after: Annotated[int, typer.Option(min=0, help="Only the events after this event id.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Print a workflow's events; --follow keeps printing them.

    Its phase_change, milestone_updated, … rows, oldest first: the dashboard's
    live stream in a terminal. --json: one JSON object a line (id, workflow_id,
    type, data, created_at); --after ID: only the later ones."""
    from phasegate.web import live

    with reported_errors():
        store = open_for_reading(repo)
        store.workflow_row(workflow_id)  # WorkflowNotFound: exit 2 before anything
        secrets = _secrets(repo)
        stop = threading.Event()
        rows = (
            live.follow_rows(store, workflow_id, after, stop)
            if follow
            else iter(store.events(workflow_id, after))
        )
        # Ctrl-C (and SIGTERM) set ``stop``: the stream ends between rows, never with
        # a KeyboardInterrupt inside a store read (which could hang the exit).
        with _stopped_by_signals(stop) if follow else contextlib.nullcontext():
            for row in rows:
                text = live.event_json(row, secrets)
                if as_json:
                    print(text, flush=True)
                else:
                    _print_event(json.loads(text))
        if stop.is_set():
            raise typer.Exit(130)


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """``STOP_SIGNALS`` set ``stop`` while inside; the handlers before are put back."""
    previous = {sig: signal.signal(sig, lambda _signum, _frame: stop.set()) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_event(shaped: dict[str, Any]) -> None:
    """One event row for a person: id, time, type and its data as JSON on one line;
    an agent's output (``agent_output``) as its role and then its lines, each
    indented under it, as the agent printed them."""
    head = f"{shaped['id']:>6} {shaped['created_at']} [bold]{shaped['type']}[/bold]"
    data = shaped["data"]
    if shaped["type"] == "agent_output":
        console.print(f"{head} {shown(str(data.get('role')))}", highlight=False)
        for line in str(data.get("text", "")).splitlines():
            console.print(f"       │ {shown(line)}", highlight=False, soft_wrap=True)
        return
    text = json.dumps(data, sort_keys=True, ensure_ascii=False)
    # soft_wrap: one row a line, for grep and tail
    console.print(f"{head} {shown(text)}", highlight=False, soft_wrap=True)


def _secrets(repo: Path) -> list[str]:
    """What the printed rows must not hold: the cartridge's and the environment's
    secrets (the environment's alone when the cartridge is broken)."""
    from phasegate.agents.env import cartridge_secrets
    from phasegate.config.cartridge import Cartridge, CartridgeError, load_cartridge

    try:
        cartridge = load_cartridge(repo_root(repo))
    except CartridgeError:
        cartridge = Cartridge()
    return cartridge_secrets(cartridge)


__all__ = ["events", "login_lines", "serve"]


def _say_line(text: str) -> None:
    err.print(shown(text), highlight=False)
