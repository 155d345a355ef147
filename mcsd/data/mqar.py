"""Multi-query associative recall (MQAR), zoology's synthetic recall task, made from a seed.

An example of length ``seq_len`` (T) with ``num_pairs`` (K) key-value pairs is a prefix
``k_1 v_1 ... k_K v_K`` (keys distinct, from ``[1, V/2)``; values distinct, from ``[V/2, V)``),
then a query region in which every key appears once more, at an even offset ``2 g`` whose gap
``g`` is drawn (without replacement) with probability proportional to ``(g + 1)^(power_a - 1)``
(short gaps likelier, as repeated bigrams in text). The label at a repeated key's position is
its value; every other label is ``IGNORE_INDEX``. The query region's other positions hold
tokens drawn uniformly from the whole vocabulary (zoology's ``random_non_queries``).
"""

from __future__ import annotations

import numpy as np
import torch

from mcsd.data.corpus import DataError

IGNORE_INDEX = -100  # the label of a position that is not scored (torch's cross_entropy default)


def mqar_examples(num_examples: int, seq_len: int, num_pairs: int, vocab_size: int, seed: int,
                  power_a: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)``, each ``(num_examples, seq_len)`` int64, a function of the arguments alone."""
    if num_pairs < 1 or 4 * num_pairs > seq_len:
        raise DataError(f"data.num_pairs={num_pairs} with data.seq_len={seq_len}: MQAR needs 1 <= num_pairs "
                        "and 4 * num_pairs <= seq_len (a prefix of pairs and room for every query); lower num_pairs")
    if vocab_size // 2 - 1 < num_pairs:
        raise DataError(f"data.vocab_size={vocab_size} has fewer than num_pairs={num_pairs} keys in [1, V/2): "
                        "raise the vocabulary")
    if not 0 < power_a <= 1:
        raise DataError(f"data.power_a={power_a} must be in (0, 1] (1: gaps uniform)")
    rng = np.random.default_rng(seed)
    half = vocab_size // 2
    keys = _weighted_without_replacement(rng, num_examples, np.ones(half - 1), num_pairs) + 1
    values = _weighted_without_replacement(rng, num_examples, np.ones(vocab_size - half), num_pairs) + half
    prefix = 2 * num_pairs
    slots = (seq_len - prefix) // 2
    gap_weights = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
    gaps = _weighted_without_replacement(rng, num_examples, gap_weights, num_pairs)

    inputs = rng.integers(0, vocab_size, size=(num_examples, seq_len))
    inputs[:, 0:prefix:2], inputs[:, 1:prefix:2] = keys, values
    query_positions = prefix + 2 * gaps
    np.put_along_axis(inputs, query_positions, keys, axis=1)
    labels = np.full((num_examples, seq_len), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, query_positions, values, axis=1)
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(labels)


def _weighted_without_replacement(rng: np.random.Generator, rows: int, weights: np.ndarray, k: int) -> np.ndarray:
    """``(rows, k)`` distinct indices into ``weights`` per row, in the order of drawing them one
    after another with probability proportional to the weights of those left: the ``k``
    smallest of Exponential(1) / weight, smallest first. Rows go in chunks, so a large
    vocabulary costs bounded memory."""
    chunk = max(1, 2**22 // len(weights))
    picks = []
    for start in range(0, rows, chunk):
        scores = rng.exponential(size=(min(chunk, rows - start), len(weights))) / weights
        smallest = np.argpartition(scores, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(scores, smallest, axis=1), axis=1)
        picks.append(np.take_along_axis(smallest, order, axis=1))
    return np.concatenate(picks)


def mqar_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example, the fraction of labelled positions whose argmax is the label: ``(batch,)``."""
    scored = labels != IGNORE_INDEX
    correct = (logits.argmax(-1) == labels) & scored
    return correct.sum(-1) / scored.sum(-1).clamp(min=1)
