"""MAD's compression read-out (mcsd/training/compression.py): what it reads, its position table
and its FLOPs."""

from __future__ import annotations

import math

import torch

from helpers.models import tiny_config
from mcsd.training.compression import sine_cosine_positions
from mcsd.training.module import LanguageModelModule


def test_position_table_is_sines_and_cosines_of_falling_frequencies() -> None:
    table = sine_cosine_positions(5, 6)
    assert table.shape == (5, 6)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    assert table[3, 2].item() == torch.tensor(math.sin(3 / 10000 ** (2 / 6))).float().item()
    assert table[3, 5].item() == torch.tensor(math.cos(3 / 10000 ** (4 / 6))).float().item()
    assert sine_cosine_positions(4, 5).shape == (4, 5)  # an odd width: one more sine column


def test_the_loss_reads_the_model_at_the_last_position_alone() -> None:
    """The training loss of a compression run: its gradient reaches the model's final hidden
    states at the last position only, and the decoder's FLOPs join the model's."""
    config = tiny_config("transformer", vocab_size=8)
    module = LanguageModelModule(config, optimizer=torch.optim.AdamW, compression_length=6)
    final = {}

    def keep(_, __, output: torch.Tensor) -> None:
        output.retain_grad()
        final["hidden"] = output

    module.model.final_norm.register_forward_hook(keep)
    ids = torch.randint(0, 8, (3, 6), generator=torch.Generator().manual_seed(0))
    loss, logits, targets = module._loss({"input_ids": ids, "labels": ids})
    loss.backward()
    assert logits.shape == (1, 18, 8) and torch.equal(targets[0], ids.flatten())
    gradient = final["hidden"].grad
    assert torch.all(gradient[:, :-1] == 0) and torch.all(gradient[:, -1].abs().sum(-1) > 0)
    assert all(param.grad is not None for param in module.decoder.parameters())
    linear = 2 * config["hidden_size"] ** 2 + config["hidden_size"] * 8
    assert module.decoder.training_flops(3) == 6 * 3 * 6 * linear
    assert module._training_flops({"input_ids": ids, "labels": ids}) == (
        module.model.training_flops(3, 6, scored=0) + 6 * 3 * 6 * linear)
