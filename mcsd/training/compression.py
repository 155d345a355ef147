"""MAD's compression read-out: a sequence reconstructed from the model's output at its last
position (the compression token) alone, so that the model must hold the whole sequence in what
it passes through that one position (Poli et al. 2024, MAD-lab's ``AutoEncoder`` backbone with
``global_pool='last'``: a non-expanding two-layer GELU MLP decoder, RMSNorm before each layer,
given the encoding plus a fixed sine-cosine embedding of the position to reconstruct). The same
decoder for every architecture, trained with it; it is not part of the saved model."""

from __future__ import annotations

import math

import torch
from torch import nn


def sine_cosine_positions(length: int, width: int) -> torch.Tensor:
    """The fixed embedding of positions ``0 .. length - 1``: ``[length, width]``, sines of
    ``position / 10000^(2i / width)`` in the even columns, cosines in the odd ones."""
    positions = torch.arange(length, dtype=torch.float64)[:, None]
    frequencies = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2, dtype=torch.float64) / width)
    table = torch.zeros(length, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(positions * frequencies)
    table[:, 1::2] = torch.cos(positions * frequencies)[:, : width // 2]
    return table.float()


class CompressionDecoder(nn.Module):
    """``encoding`` ``[B, D]`` (the final-normed hidden state at the compression token) ->
    logits ``[B, length, vocab]`` of every position of the sequence it was read from."""

    def __init__(self, hidden_size: int, vocab_size: int, length: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.length = length
        self.register_buffer("positions", sine_cosine_positions(length, hidden_size), persistent=False)
        self.layers = nn.Sequential(nn.RMSNorm(hidden_size), nn.Linear(hidden_size, hidden_size), nn.GELU(),
                                    nn.RMSNorm(hidden_size), nn.Linear(hidden_size, hidden_size), nn.GELU())
        self.head = nn.Sequential(nn.RMSNorm(hidden_size), nn.Linear(hidden_size, vocab_size))
        self.init_std = init_std
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """MAD's initialisation: linear weights normal with ``init_std``, biases zero, norms one."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=self.init_std)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm):
                module.reset_parameters()

    def forward(self, encoding: torch.Tensor) -> torch.Tensor:
        queries = encoding[:, None, :] + self.positions.to(encoding.dtype)  # [B, length, D]
        return self.head(self.layers(queries))

    def training_flops(self, batch: int) -> int:
        """Forward and backward FLOPs of its matrices over ``batch`` sequences (6 per weight per position)."""
        weights = sum(module.weight.numel() for module in self.modules() if isinstance(module, nn.Linear))
        return 6 * batch * self.length * weights
