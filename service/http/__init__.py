"""The HTTP room: the app, the middleware, the guarded connection, the parser processes, the
memory budget, API keys, metrics and the routes. It reaches the attention pipeline through one
door, :mod:`service.trace` (``admit`` and ``run``), and the wire formats through
:mod:`service.wire`."""
