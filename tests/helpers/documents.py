"""Packed rows of documents for the ops' tests: where documents start, and each document alone."""

from __future__ import annotations

from collections.abc import Callable

import torch

ROW_DOCUMENTS = [[1, 2, 63, 64, 65, 22], [100, 117]]
"""Two rows of 217 tokens: one of documents starting at chunk edges and inside chunks, one whose
first document goes on from the initial state (its first token is no start)."""


def packed_starts() -> torch.Tensor:
    """``[2, 217]`` bool: where :data:`ROW_DOCUMENTS`' documents start (row 1's first one excepted)."""
    starts = torch.zeros(len(ROW_DOCUMENTS), sum(ROW_DOCUMENTS[0]), dtype=torch.bool)
    for row, lengths in enumerate(ROW_DOCUMENTS):
        starts[row, torch.tensor([0, *lengths[:-1]]).cumsum(0)] = True
    starts[1, 0] = False
    return starts


def each_alone(
    run: Callable[[int, slice, bool], tuple[torch.Tensor, torch.Tensor]], row: int, axis: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``row``'s documents run one by one (``run(row, tokens, carried)``: ``carried`` for the
    document that goes on from the initial state): their outputs concatenated along ``axis``, and
    the last one's final state."""
    pieces, state, offset = [], None, 0
    for number, length in enumerate(ROW_DOCUMENTS[row]):
        piece, state = run(row, slice(offset, offset + length), number == 0 and row == 1)
        pieces.append(piece)
        offset += length
    return torch.cat(pieces, dim=axis), state
