"""The attention engine: pure NumPy, no HTTP, no pydantic."""
