"""Operations endpoints: liveness, readiness, version and metrics; and the offline API docs."""

import html
import json
import os
import platform
import sys
from importlib.resources import files
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from service import __version__
from service.core.attention import scaled_dot_product_attention
from service.http import metrics

router = APIRouter(tags=["operations"])
keyed_router = APIRouter(tags=["operations"])  # behind the API key when keys are configured
DOCS_ASSETS = "/docs-assets"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# The docs pages may load nothing from outside the service: in a closed network a CDN request
# would hang or fail, and the browser should not even try (ReDoc's footer links a CDN logo).
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: answers while the process is up (no work done)."""
    return {"status": "ok", "version": __version__}


@router.get("/readyz", responses={503: {"description": "Not ready yet"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 once start-up (including a warm-up computation) has finished."""
    ready = bool(getattr(request.app.state, "ready", False))
    return JSONResponse(
        {"status": "ready" if ready else "starting"}, status_code=200 if ready else 503
    )


@keyed_router.get("/version")
def version() -> dict[str, Any]:
    """Package, Python, NumPy and BLAS versions, and the BLAS thread setting."""
    blas: dict[str, Any] = {}
    try:
        build = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = {"name": build.get("name"), "version": build.get("version")}
    except Exception:  # pragma: no cover - older NumPy
        blas = {"name": "unknown"}
    blas["threads_env"] = {
        k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ
    }
    return {
        "service": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "blas": blas,
    }


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus_metrics() -> Response:
    """Prometheus metrics: requests by endpoint and status, latency, request and response sizes,
    admission (admitted, queued, rejected, waiting, budget). Async: never waits for the compute
    pool."""
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


def warm_up() -> None:
    """One tiny computation, so the first real request does not pay for imports and BLAS start."""
    q = np.eye(2)[None]
    scaled_dot_product_attention(q, q, q)


# Swagger UI's settings: syntax highlighting off so that large responses do not freeze the page;
# "Try it out" open at once
SWAGGER_SETTINGS: dict[str, Any] = {
    "dom_id": "#swagger-ui",
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    "syntaxHighlight": False,
    "tryItOutEnabled": True,
}
# The explorer's Swagger UI plugin that lays JSON out with one matrix row a line (the worked
# examples in "Try it out", the answers); Swagger UI's own layout takes a line per number
SWAGGER_ROWS_JS = "/static/swagger-rows.js"
# A bar at the top of both docs pages: back to the explorer, and to the other docs
NAV_STYLE = """<style>
body { margin: 0; }
nav.docs-nav { font: 15px/1.4 system-ui, sans-serif; background: #1d232b; color: #fff;
  padding: 8px 20px; display: flex; gap: 16px; flex-wrap: wrap; align-items: center; }
nav.docs-nav a { color: #fff; }
nav.docs-nav a.explorer { font-weight: 600; }
</style>"""


def _json(value: Any) -> str:
    """JSON for a <script>: no "</" that could end the script early."""
    return json.dumps(value).replace("</", "<\\/")


def docs_nav(root: str, here: str) -> str:
    """The docs pages' top bar: a link back to the explorer (at the root path's "/") first, then
    the other docs page and the OpenAPI document."""
    links = [("Swagger UI", "/docs"), ("ReDoc", "/redoc"), ("OpenAPI document", "/openapi.json")]
    others = "".join(
        f'<a href="{html.escape(root + path)}">{name}</a>' for name, path in links if path != here
    )
    return (
        f'<nav class="docs-nav" aria-label="Attention service">'
        f'<a class="explorer" href="{html.escape(root + "/")}">← Attention explorer</a>'
        f"{others}</nav>"
    )


def swagger_page(root: str, openapi_url: str, title: str) -> str:
    """Swagger UI's page: its assets from /docs-assets, the explorer's plugin that lays JSON out
    in rows (static/swagger-rows.js), and the bar back to the explorer."""
    settings = "".join(f"  {_json(k)}: {_json(v)},\n" for k, v in SWAGGER_SETTINGS.items())
    assets = f"{root}{DOCS_ASSETS}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="{html.escape(assets)}/swagger-ui.css">
<link rel="shortcut icon" href="{html.escape(assets)}/favicon.png">
<title>{html.escape(title)}</title>
{NAV_STYLE}
</head>
<body>
{docs_nav(root, "/docs")}
<div id="swagger-ui"></div>
<script src="{html.escape(assets)}/swagger-ui-bundle.js"></script>
<script src="{html.escape(root + SWAGGER_ROWS_JS)}"></script>
<script>
const ui = SwaggerUIBundle({{
  url: {_json(openapi_url)},
{settings}  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  plugins: [JsonInRows],
}});
</script>
</body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """Swagger UI at /docs and ReDoc at /redoc from assets shipped in a package (no CDN), each
    with a bar linking back to the explorer."""
    assets = files("fastapi_offline") / "static"
    redoc_js = (assets / "redoc.standalone.js").read_text(encoding="utf-8")
    # ReDoc's footer loads its logo from a CDN, which the CSP refuses (a console error on every
    # load); an empty image instead makes ReDoc drop the logo and keep its link
    redoc_js = redoc_js.replace(REDOC_LOGO, "data:,")

    @app.get(f"{DOCS_ASSETS}/redoc.standalone.js", include_in_schema=False)
    def redoc_script() -> Response:
        return Response(
            redoc_js,
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    app.mount(DOCS_ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")

    def prefix(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        root = prefix(request)
        page = swagger_page(root, f"{root}{app.openapi_url}", f"{app.title} — Swagger UI")
        return HTMLResponse(page, headers={"Content-Security-Policy": DOCS_CSP})

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = prefix(request)
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} — ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        # the bar back to the explorer above ReDoc's own page
        body = bytes(page.body).decode("utf-8")
        body = body.replace("</head>", f"{NAV_STYLE}\n</head>", 1)
        body = body.replace("<body>", f"<body>\n{docs_nav(root, '/redoc')}", 1)
        return HTMLResponse(body, headers={"Content-Security-Policy": DOCS_CSP})


STATIC = files("service") / "static"
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'self'"
)


def install_explorer(app: FastAPI) -> None:
    """The explorer page at / and its files at /static (shipped in the package, no CDN)."""
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/", include_in_schema=False)
    def explorer() -> HTMLResponse:
        page = HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))
        page.headers["Content-Security-Policy"] = PAGE_CSP
        return page
