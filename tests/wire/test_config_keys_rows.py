"""hf_config_keys.KEYS (and DEFAULTS) is one dict literal whose rows come from several families' blocks: a key
written in two blocks keeps only the later row (Python's dict literal), silently dropping the
earlier one's model types. Each key must be written once (a row shared by families names them
all), found here by reading the literal's source."""

import ast
from collections import Counter
from pathlib import Path

import service.wire.hf_config_keys as keys_module


def _words_in(node: ast.AST) -> list[str]:
    """The keys a ``**{k: … for k in _words("…")}`` block or a plain ``"key": …`` entry writes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.DictComp):
        for gen in node.generators:
            call = gen.iter
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "_words"
                and isinstance(call.args[0], ast.Constant)
            ):
                return str(call.args[0].value).split()
    return []


def _tables(name: str) -> list[ast.Dict]:
    """The dict literals assigned to ``name`` or merged into it (``name |= {…}``)."""
    tree = ast.parse(Path(keys_module.__file__).read_text())
    found: list[ast.Dict] = []
    for node in ast.walk(tree):
        target = getattr(node, "target", None)
        if (
            isinstance(node, ast.AnnAssign | ast.AugAssign)
            and isinstance(target, ast.Name)
            and target.id == name
            and isinstance(node.value, ast.Dict)
        ):
            found.append(node.value)
    assert found
    return found


def _twice(tables: list[ast.Dict]) -> dict[str, int]:
    """Keys written in more than one row of the tables; a row of a later block that replaces
    the earlier row from it (``"k": replace(KEYS["k"], …)``) is an update, not a second row."""
    written: list[str] = []
    for table in tables:
        for key, value in zip(table.keys, table.values, strict=True):
            names = _words_in(key) if key is not None else _words_in(value)
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "replace":
                continue
            written += names
    return {k: n for k, n in Counter(written).items() if n > 1}


def test_each_config_key_is_written_once_in_the_keys_table() -> None:
    twice = _twice(_tables("KEYS"))
    assert not twice, f"written in more than one row (the later drops the earlier): {twice}"


def test_each_family_has_one_row_of_defaults() -> None:
    twice = _twice(_tables("DEFAULTS"))
    assert not twice, f"families with two rows (the later drops the earlier): {twice}"
