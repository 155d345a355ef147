"""A packed batch as flash-linear-attention's kernels take one (``cu_seqlens``, the field's
convention for documents apart): the rows laid end to end as one sequence of ``B * N`` tokens,
cut at every document start and every row start, each piece from its own initial state. The fla
adapters of the ops whose documents restart a state (decayed attention, GLA) share it."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class DocumentPieces:
    """A packed batch as fla's variable-length sequences: ``cu_seqlens`` ``[S + 1]`` (where each
    piece starts in the ``B * N`` tokens laid end to end, and their end), each piece's
    ``initial`` state ``[S, H, Dk, Dv]`` and ``row_last`` ``[B]``, the piece whose final state
    is each row's."""

    cu_seqlens: torch.Tensor
    initial: torch.Tensor
    row_last: torch.Tensor


def document_pieces(
    starts: torch.Tensor, initial_state: torch.Tensor | None, heads: int, key_width: int, value_width: int,
    dtype: torch.dtype,
) -> DocumentPieces:
    """The pieces of a packed batch (``starts`` ``[B, N]``): cut at every document start and
    every row start; each piece starts from a zero state, a row's first piece from the row's
    ``initial_state`` where the row does not begin with a document start."""
    batch, length = starts.shape
    pieces = starts.clone()
    pieces[:, 0] = True  # a row's first token begins a piece, a document's start or not
    first = pieces.flatten().nonzero().squeeze(1)  # [S]: each piece's first token in the B * N
    cu_seqlens = F.pad(first, (0, 1), value=batch * length)
    row_first = torch.searchsorted(first, torch.arange(batch, device=first.device) * length)  # [B]
    initial = torch.zeros(len(first), heads, key_width, value_width, device=starts.device, dtype=dtype)
    if initial_state is not None:  # a row that does not begin with a document goes on from its state
        initial[row_first] = initial_state * ~starts[:, 0, None, None, None]
    row_last = torch.cat([row_first[1:], row_first.new_tensor([len(first)])]) - 1
    return DocumentPieces(cu_seqlens, initial, row_last)
