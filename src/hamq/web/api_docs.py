"""The API's interactive docs (Swagger UI) at ``/api/docs``, served from the vendored copy
under ``static/vendor/swagger-ui`` (see its README). FastAPI's default page loads the
latest swagger-ui 5 from a CDN into the API's own origin: a changed package there would
run same-origin with an API that has no login, and without the internet the page is blank.
Here the page runs only its own files and the one inline script FastAPI writes, pinned by
its hash."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Final

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from hamq.web.console import SHELL_HEADERS

DOCS_PATH: Final = "/api/docs"
_VENDOR: Final = "/static/vendor/swagger-ui"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

router = APIRouter(include_in_schema=False)


def docs_page(title: str, openapi_url: str) -> HTMLResponse:
    """The Swagger UI page with a CSP allowing only this origin, the hash of its inline
    start-up script, and the inline styles swagger-ui sets on its elements."""
    page = get_swagger_ui_html(
        openapi_url=openapi_url,
        title=f"{title} - docs",
        swagger_js_url=f"{_VENDOR}/swagger-ui-bundle.js",
        swagger_css_url=f"{_VENDOR}/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
        # no badge fetched from validator.swagger.io
        swagger_ui_parameters={"validatorUrl": None},
    )
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in _INLINE_SCRIPT.findall(bytes(page.body).decode())
    )
    csp = (
        f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
    page.headers.update({**SHELL_HEADERS, "Content-Security-Policy": csp})
    return page


@router.get(DOCS_PATH)
def api_docs(request: Request) -> HTMLResponse:
    app = request.app
    return docs_page(app.title, app.openapi_url)
