"""The HTTP contract through the ASGI app: every endpoint's fields, errors, comparison and references."""
