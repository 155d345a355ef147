"""Markdown tables, as every table the project prints or writes into a README is drawn."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header, its rule and a line per row, each cell as ``str`` gives it
    (no newline after the last line)."""
    lines = [_line(header), "|" + " --- |" * len(header)]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)


def _line(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"
