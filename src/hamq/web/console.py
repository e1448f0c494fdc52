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


def _shell() -> FileResponse:
    # no-cache: a reload after an upgrade revalidates the shell instead of keeping the old one
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


for _path in PAGES:
    router.add_api_route(_path, _shell, methods=["GET"], name=f"console{_path}")
