"""The dashboard, ``phasegate serve``: the board, a workflow's page,
live events over SSE, behind a token and CSRF. A thin skin: reads come from
the store, a person's decisions go through the engine's single commit path.

``create_app`` (app.py) makes the FastAPI app; ``Access`` (auth.py) holds
the token, the identity and the sessions; ``serve`` (serve.py) runs it with
uvicorn beside the worker.
"""

from phasegate.web.app import create_app
from phasegate.web.auth import Access

__all__ = ["Access", "create_app"]
