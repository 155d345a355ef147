"""The forward context: what one call of a model tells every op it reaches, built once per call.

A model's forward (:meth:`mcsd.models.modeling.CausalLM.run`) and its decoding step build one
:class:`ForwardContext` from the call and the model's config and hand it through the layers and
mixers to the ops (as fla's ops take ``cu_seqlens``): the ``form`` to compute, the ``kernels``
that run it (:mod:`mcsd.ops.kernels`), the ``chunk_size`` of the chunk forms, and the documents of
a packed batch as the ops take them (``starts``) and as positions take them (``position_ids``).
No mixer keeps a copy of any of them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mcsd.ops.common import check_form


class ForwardContext(NamedTuple):
    """How one call computes: ``form`` (one of :data:`mcsd.ops.common.FORMS`), ``kernels``
    (``model.kernels``), ``chunk_size`` (the chunk forms' chunk), and, for a packed batch of
    documents apart, ``starts`` ``[B, N]`` bool (where a document starts: no state reaches that
    token from before it) and ``position_ids`` ``[B, N]`` (each token's position in its own
    document, 0 where one starts), or ``None`` for both. A decoding step's context has the
    recurrent form and no documents (:meth:`step`)."""

    form: str
    kernels: str = "torch"
    chunk_size: int = 64
    starts: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, form: str, kernels: str = "torch", chunk_size: int = 64,
           position_ids: torch.Tensor | None = None) -> ForwardContext:
        """The context of a call in ``form``, its documents given as ``position_ids`` (Hugging
        Face's convention for a packed batch) and turned into ``starts`` here, once."""
        check_form(form)
        return cls(form, kernels, chunk_size, None if position_ids is None else position_ids == 0, position_ids)

    @classmethod
    def step(cls, kernels: str = "torch", chunk_size: int = 64) -> ForwardContext:
        """The context of a decoding step: one token per row, the recurrent form's numbers."""
        return cls("recurrent", kernels, chunk_size)


CHUNK = ForwardContext("chunk")
"""The chunk form through PyTorch's forms, no documents: an op's default context."""

STEP = ForwardContext.step()
"""A decoding step through PyTorch's forms: an op's step's default context."""
