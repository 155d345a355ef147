"""Cross-domain mixture of experts (CDMoE), the hybrid's MLP switch (``mlp=cdmoe``).

As the paper's listing (its Appendix B.4) computes it: a shared expert ``phi = W_down
silu(W_up x)`` (the cross-domain knowledge every token uses), then for each of ``heads``
retrieval heads a query from ``phi``, product keys (two sets of ``s`` sub-keys of half the
query's width; ``s * s`` experts) that pick the top k experts out of the k x k best pairs,
and single-neuron private experts ``i`` with a down vector ``d_i`` and an up vector ``u_i``:

    y = phi + sum_heads sum_{i in top k} silu((phi . d_i) * score_i) u_i

(the score multiplies inside the activation, as the listing has it). Only the selected
experts' vectors are read per token: :meth:`inactive_parameters_per_token`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.wonderful_matrices.configuration_wonderful_matrices import WonderfulMatricesConfig


class CrossDomainMoE(nn.Module):
    """CDMoE with a shared expert of width ``mlp_hidden_size``. Initialisation: Normal(0,
    init_std) everywhere; the shared down projection and the experts' up vectors write into
    the residual stream (scaled by the skeleton)."""

    def __init__(self, config: WonderfulMatricesConfig) -> None:
        super().__init__()
        self.init_std = config.init_std
        self.heads = config.cdmoe_heads
        self.top_k = config.cdmoe_top_k
        self.side = math.isqrt(config.cdmoe_experts)
        self.half_width = config.cdmoe_retrieval_width // 2
        self.shared_up = nn.Linear(config.hidden_size, config.mlp_hidden_size, bias=False)
        self.shared_down = nn.Linear(config.mlp_hidden_size, config.hidden_size, bias=False)
        self.queries = nn.Linear(config.hidden_size, self.heads * config.cdmoe_retrieval_width, bias=False)
        self.sub_keys = nn.Parameter(torch.empty(self.heads, 2, self.side, self.half_width))
        self.down_embed = nn.Embedding(config.cdmoe_experts, config.hidden_size)
        self.up_embed = nn.Embedding(config.cdmoe_experts, config.hidden_size)

    def reset_parameters(self) -> None:
        for weight in (self.shared_up.weight, self.shared_down.weight, self.queries.weight, self.sub_keys,
                       self.down_embed.weight, self.up_embed.weight):
            nn.init.normal_(weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.shared_down.weight, self.up_embed.weight]

    def inactive_parameters_per_token(self) -> int:
        """The expert vectors a token does not read: all but ``heads * top_k`` experts'."""
        experts, width = self.down_embed.weight.shape
        return 2 * width * max(0, experts - self.heads * self.top_k)

    def weight_flops_per_token(self) -> int:
        """The shared expert's and the queries' weights, the sub-keys (every query against all
        of them) and each head's ``top_k`` selected experts' down and up vectors, 2 FLOPs each."""
        linears = sum(layer.weight.numel() for layer in (self.shared_up, self.shared_down, self.queries))
        experts = 2 * self.heads * self.top_k * self.down_embed.weight.shape[1]
        return 2 * (linears + self.sub_keys.numel() + experts)

    def select(self, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Product-key retrieval: (scores, expert indices), each ``[..., heads, top_k]``."""
        queries = self.queries(phi).unflatten(-1, (self.heads, 2, self.half_width))
        similarity = torch.einsum("...hpw,hpsw->...hps", queries, self.sub_keys)  # [..., heads, 2, side]
        scores, indices = similarity.topk(self.top_k, dim=-1)  # the best sub-keys of each half
        pair_scores = scores[..., 0, :, None] + scores[..., 1, None, :]  # [..., heads, k, k]
        pair_indices = indices[..., 0, :, None] * self.side + indices[..., 1, None, :]
        best, chosen = pair_scores.flatten(-2).topk(self.top_k, dim=-1)
        return best, pair_indices.flatten(-2).gather(-1, chosen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phi = self.shared_down(F.silu(self.shared_up(x)))
        scores, experts = self.select(phi)
        activation = F.silu(torch.einsum("...d,...hkd->...hk", phi, self.down_embed(experts)) * scores)
        return phi + torch.einsum("...hk,...hkd->...d", activation, self.up_embed(experts))
