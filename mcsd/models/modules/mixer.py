"""The interface every token mixer implements (and every MLP that carries a decoding state)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from mcsd.ops.context import ForwardContext


class TokenMixer(nn.Module):
    """Interface of a token mixer: ``forward(x, layer_state, position, context) -> (y, new_state)``.

    ``x`` is ``[B, N, D]`` at absolute positions ``position .. position+N-1``, computed as the
    call's :class:`~mcsd.ops.context.ForwardContext` says (its form, its kernels, its chunk size:
    the model builds it once per call and a mixer keeps no copy of them), or, where the context
    keeps a packed batch's documents apart (``context.position_ids`` ``[B, N]``: each token's
    position in its own document; ``context.starts``: where one starts), at those positions:
    nothing of one document reaches another's tokens (no state, no attention, no position), and
    the state returned is the last document's.
    ``layer_state`` is ``None`` at the start of a sequence. A mixer initialises its own
    parameters (``reset_parameters``) and names the weights that write into the residual
    stream (``residual_weights``, drawn at ``init_std``), which the skeleton scales to a depth-scaled std.
    """

    sequence_backward_factor: ClassVar[int] = 2
    """The backward's work over the sums of :meth:`sequence_flops`, in forwards: 2 where both
    operands of each product are learned activations (a gradient for each), 1 where one is a
    fixed matrix (MCSD's filters: only the input's gradient)."""

    sequence_products: ClassVar[bool] = True
    """Whether the sums of :meth:`sequence_flops` run as tensor products (``matmul``, ``einsum``),
    which ``FlopCounterMode`` counts; ``False`` where they are elementwise (RWKV-4's WKV), which
    it does not see."""

    separates_documents: ClassVar[bool] = False
    """Whether ``forward`` honours a context's documents (apart in a packed batch); a model
    with a mixer that does not refuses them in one line (:meth:`CausalLM.run`)."""

    state_rewinds: ClassVar[bool] = False
    """Whether the state keeps an entry per position (a KV cache), so that moving the position
    back forgets the tokens after it (assisted decoding's cache crop); a recurrent state has
    folded every token in and cannot forget one."""

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> Any:
        """The state before the first token (``None`` where the mixer needs none);
        ``capacity`` is a hint of how many tokens will follow (a KV cache preallocates)."""
        return None

    def last_document(self, state: Any, length: int | torch.Tensor) -> Any:
        """The state after a packed run (``position_ids``) as decoding the run's last document on
        needs it, that document being its last ``length`` tokens: a recurrent state is already
        the last document's; a state with an entry per position (a KV cache) keeps its last ``length``
        (``[B]``, each row's own: every position, each row read from its own start)."""
        return state

    def reset_parameters(self) -> None:
        raise NotImplementedError(f"{type(self).__qualname__} must initialise its parameters")

    def step(
        self, x: torch.Tensor, state: Any, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, Any]:
        """One token per row, ``x`` ``[B, D]`` -> ``([B, D], new state)``: decoding's hot path,
        in a step's ``context`` (:meth:`ForwardContext.step`: the recurrent form, no documents).
        By default the recurrent form on a sequence of one; a mixer overrides it with a leaner
        step that computes the same numbers, and that also takes ``position`` as a 0-d tensor on
        the device with ``state`` given (the step at fixed addresses that CUDA graphs replay,
        :meth:`CausalLM.static_step`: no Python branch on the position, a KV cache written at it)."""
        y, state = self(x[:, None], state, position, context)
        return y[:, 0], state

    def residual_weights(self) -> list[nn.Parameter]:
        return []

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """The forward FLOPs of the mixer's sums over positions for one row of ``length`` tokens
        in ``context``'s form and chunk size (:mod:`mcsd.ops.flops`' rule; its weights' products are counted apart, by
        :func:`weight_flops_per_token`): what attention's ``12 L d N`` and the chunk forms'
        intra-chunk products add to ``6 N`` in the model FLOPs of :meth:`CausalLM.training_flops`."""
        raise NotImplementedError(f"{type(self).__qualname__} must count its sequence FLOPs")
