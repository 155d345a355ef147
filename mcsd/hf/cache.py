"""A ``transformers`` :class:`~transformers.Cache` around the project's decoding state, so that
``generate`` reads the prompt once and then runs each model's lean one-token step (fixed
recurrent states and KV caches per layer, hybrids included)."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast

from mcsd.errors import MCSDError
from mcsd.models import DecodingState
from mcsd.models.modules.state import map_tensors, tensors_of

CACHE_KEY = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The name ``transformers`` gives the decoding cache in model outputs and in what ``generate``
passes to ``forward``: ``past_key_values`` up to 5.23, ``cache`` from 5.24."""


class DecodingCache(Cache):
    """The decoding state of a batch of ``batch_size`` rows, after ``state.position`` tokens.

    Beam search reorders its rows (every state tensor is batch-first, :class:`DecodingState`).
    A cache whose every layer keeps an entry per position (``rewinds``: attention-only models)
    can be cropped back, which assisted decoding needs; a recurrent state cannot, and says so.
    """

    def __init__(self, state: DecodingState, batch_size: int, rewinds: bool) -> None:
        super().__init__(layers=[])
        self.state = state
        self.rows = batch_size
        self.rewinds = rewinds

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rows={self.rows}, position={self.state.position})"

    def __len__(self) -> int:
        return len(self.state.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.state.position

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no maximum: recurrent states are fixed, KV caches grow

    @property
    def batch_size(self) -> int:
        return self.rows

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def is_croppable(self) -> bool:
        return self.rewinds

    @property
    def is_linear(self) -> list[bool]:
        """No layer is a ``transformers`` linear-attention cache: this one counts its tokens
        (``get_seq_length``), so ``generate`` gives it only the tokens it has not read."""
        return [False] * len(self)

    def reset(self) -> None:
        raise MCSDError("this cache cannot be reset in place: start again without a cache")

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` tokens (``transformers``' convention: zero or negative)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): give minus the number of tokens to remove")
        if tokens_to_remove == 0:
            return
        keep = max(self.state.position + tokens_to_remove, 0)
        if not self.rewinds:
            raise MCSDError("a recurrent decoding state cannot be cropped (assisted decoding, or anything that "
                            "takes tokens back): its tokens are folded into fixed-size states; decode without it")
        removed = self.state.position - keep
        positions = None if self.state.positions is None else self.state.positions - removed
        self.state = DecodingState(position=keep, layers=self.state.layers, positions=positions)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        device = next(iter(self._tensors()), torch.empty(0)).device
        self.select_rows(torch.arange(self.rows, device=device).repeat_interleave(repeats))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep the state rows ``rows`` (with repeats), in that order, in every stream."""

        def select(tensor: torch.Tensor) -> torch.Tensor:
            streams = tensor.shape[0] // self.rows
            index = rows.to(tensor.device)
            if streams > 1:
                offsets = torch.arange(streams, device=tensor.device)[:, None] * self.rows
                index = (offsets + index[None, :]).flatten()
            return tensor.index_select(0, index)

        positions = self.state.positions
        self.state = DecodingState(position=self.state.position, layers=map_tensors(self.state.layers, select),
                                   positions=None if positions is None else positions.index_select(
                                       0, rows.to(positions.device)))
        self.rows = len(rows)

    def _tensors(self) -> list[torch.Tensor]:
        return tensors_of(self.state.layers)
