"""The ASGI application object: ``uvicorn service.main:app``."""

from service.http.app import create_app
from service.memory import tune_allocator

tune_allocator()  # in every worker process, before any request allocates
app = create_app()
