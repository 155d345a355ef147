"""Markdown tables: one drawing of them (:func:`mcsd.markdown.markdown_table`) for every table the
project writes."""

from __future__ import annotations

import ast
from pathlib import Path

import mcsd
from mcsd.markdown import markdown_table


def test_a_table_is_its_header_its_rule_and_a_line_per_row() -> None:
    assert markdown_table(["curve", "width", "ppl"], [["MCSD", 64, "12.5"], ["Transformer", 128, ""]]) == (
        "| curve | width | ppl |\n| --- | --- | --- |\n| MCSD | 64 | 12.5 |\n| Transformer | 128 |  |")
    assert markdown_table(["only"], []) == "| only |\n| --- |"


def test_no_module_draws_a_table_rule_of_its_own() -> None:
    """A Markdown rule (``--- |``) is written by :mod:`mcsd.markdown` alone (the model card's
    two-column key-value block, which has no header, aside)."""
    package = Path(mcsd.__file__).parent
    drawn = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "--- |" in node.value:
                drawn.add(path.relative_to(package).as_posix())
    assert drawn == {"markdown.py"}
