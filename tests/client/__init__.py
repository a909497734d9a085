"""The Python client: a mock transport, the ASGI app in process, a real server."""
