"""The web console: one HTML shell served at each page's path; the pages are plain ES
modules under ``static/`` that read and act through the JSON API, so the console shows
exactly what a script sees and needs no build step.

Every page path answers the same shell (the script picks the page from the path), so a page
can be bookmarked and reloaded; none of them is part of the API's OpenAPI schema."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC_DIR: Final = Path(__file__).parent / "static"
# The console's pages, by path; static/js/main.js holds the same list with their titles.
PAGES: Final = ("/", "/topics", "/queues", "/consumer-groups", "/policies", "/messages")

router = APIRouter(include_in_schema=False)


# The shell's headers. no-cache: a reload after an upgrade revalidates the shell instead of
# keeping the old one. No page may frame the console (a framed console lets a page trick
# clicks onto its buttons), and it runs only its own scripts and styles, so a name or message
# that ever reached the DOM as markup could not run.
SHELL_HEADERS: Final = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": (
        "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _shell() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers=SHELL_HEADERS)


for _path in PAGES:
    router.add_api_route(_path, _shell, methods=["GET"], name=f"console{_path}")
