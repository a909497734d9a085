"""Request declarations: fields, their types and their docs. Rules that involve several fields
live in :mod:`service.trace.rules`."""
