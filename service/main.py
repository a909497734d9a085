"""The ASGI application object: ``uvicorn service.main:app``."""

from service.api.app import create_app

app = create_app()
