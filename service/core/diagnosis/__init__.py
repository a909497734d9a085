"""The diagnosis: which common mistakes reproduce a caller's numbers. ``search`` compares and
searches, ``mistakes`` is the table of mistakes, ``stages`` the steps as a caller with a
mistake computes them, ``recompute`` runs those steps. NumPy only, no I/O."""
