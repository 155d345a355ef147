"""The MQAR generator against its definition, and its accuracy."""

from __future__ import annotations

import pytest
import torch

from mcsd.data.corpus import DataError
from mcsd.data.mqar import IGNORE_INDEX, mqar_accuracy, mqar_examples

VOCAB, T, K = 64, 48, 6


def test_examples_follow_the_definition() -> None:
    inputs, labels = mqar_examples(200, T, K, VOCAB, seed=3)
    assert inputs.shape == labels.shape == (200, T) and inputs.dtype == labels.dtype == torch.int64
    assert 0 <= inputs.min() and inputs.max() < VOCAB
    for example, label in zip(inputs.tolist(), labels.tolist()):
        keys, values = example[0 : 2 * K : 2], example[1 : 2 * K : 2]
        assert len(set(keys)) == K and all(1 <= key < VOCAB // 2 for key in keys)
        assert len(set(values)) == K and all(VOCAB // 2 <= value < VOCAB for value in values)
        pairs = dict(zip(keys, values))
        scored = [position for position, value in enumerate(label) if value != IGNORE_INDEX]
        # One label per key, in the query region, at an even offset, on that key, equal to its value.
        assert len(scored) == K and all(position >= 2 * K and (position - 2 * K) % 2 == 0 for position in scored)
        assert sorted(example[position] for position in scored) == sorted(keys)
        assert all(label[position] == pairs[example[position]] for position in scored)


def test_examples_are_a_function_of_the_seed() -> None:
    first, again, other = (mqar_examples(8, T, K, VOCAB, seed=seed) for seed in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("power_a", [0.01, 1.0])
def test_gaps_follow_the_power_law(power_a: float) -> None:
    """p(g) ~ (g + 1)^(a - 1): with a = 0.01 the first slot is taken far more often than the
    last; with a = 1 the gaps are uniform."""
    _, labels = mqar_examples(4000, 128, 4, 512, seed=0, power_a=power_a)
    gaps = ((labels != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2
    counts = torch.bincount(gaps, minlength=(128 - 8) // 2).float()
    if power_a == 1.0:
        assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()
    else:
        assert counts[0] > 20 * counts[-1].clamp(min=1)


def test_accuracy_is_one_for_an_oracle_and_chance_for_a_constant_model() -> None:
    inputs, labels = mqar_examples(500, T, K, VOCAB, seed=0)
    oracle = torch.nn.functional.one_hot(labels.clamp(min=0), VOCAB).float()
    assert torch.equal(mqar_accuracy(oracle, labels), torch.ones(500))
    constant = torch.zeros(500, T, VOCAB)
    constant[..., VOCAB // 2] = 1.0  # always the first value token
    accuracy = mqar_accuracy(constant, labels).mean().item()
    chance = 1 / (VOCAB - VOCAB // 2)
    assert abs(accuracy - chance) < 0.01


@pytest.mark.parametrize(("seq_len", "num_pairs", "vocab_size", "field"),
                         [(20, 6, 64, "num_pairs"), (48, 0, 64, "num_pairs"), (48, 6, 8, "vocab_size")])
def test_impossible_settings_fail_in_one_line_naming_the_field(seq_len: int, num_pairs: int, vocab_size: int,
                                                              field: str) -> None:
    with pytest.raises(DataError, match=f"data.{field}="):
        mqar_examples(4, seq_len, num_pairs, vocab_size, seed=0)
