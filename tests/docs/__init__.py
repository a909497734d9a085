"""The docs hold: README and guides run as tests, the notebook in a real kernel, the layout map."""
