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

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from mcsd.data.corpus import DataError
from mcsd.data.datamodule import SplitsDataModule

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
    return prediction_accuracy(logits.argmax(-1), labels)


def prediction_accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example, the fraction of labelled positions where ``predictions`` (token ids, any
    value where unlabelled) equal ``labels``: ``(batch,)``."""
    scored = labels != IGNORE_INDEX
    correct = (predictions == labels) & scored
    return correct.sum(-1) / scored.sum(-1).clamp(min=1)


def check_split_sizes(num_train: int, num_val: int, batch_size: int, token_budget: int | None) -> None:
    """One line naming the setting, for example counts, a batch or a token budget a synthetic
    datamodule cannot take."""
    for field, value in (("num_train", num_train), ("num_val", num_val), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise DataError(f"data.{field}={value!r} must be a positive integer")
    if num_train < batch_size:
        raise DataError(f"data.num_train={num_train} is fewer than data.batch_size={batch_size}: "
                        "raise num_train or lower batch_size")
    if token_budget is not None and token_budget < 1:
        raise DataError(f"data.token_budget={token_budget} must be a positive number of tokens (or null)")


class LabelledExamples(Dataset):
    """``{"input_ids", "labels"}`` rows of two aligned tensors."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.inputs[index], "labels": self.labels[index]}


class _FreshExamples(Dataset):
    """Training examples drawn anew for every pass: item ``pass * num_examples + i`` is example
    ``i`` of pass ``pass``, whose ``num_examples`` are :func:`mqar_examples` from the pass's own
    seed (pass 0: ``seed`` itself, so the first pass equals the fixed set of that seed). One
    pass is held at a time: the sampler reads a pass through before the next."""

    fresh_each_pass = True

    def __init__(self, num_examples: int, seed: int, **task: Any) -> None:
        self.num_examples, self.seed, self.task = num_examples, seed, task
        self.held_pass, self.held = -1, LabelledExamples(torch.empty(0), torch.empty(0))

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        pass_index, row = divmod(index, self.num_examples)
        if pass_index != self.held_pass:
            seed = self.seed if pass_index == 0 else int(np.random.SeedSequence([self.seed, pass_index]).generate_state(1)[0])
            self.held_pass, self.held = pass_index, LabelledExamples(*mqar_examples(self.num_examples, seed=seed, **self.task))
        return self.held[row]


class MQARDataModule(SplitsDataModule):
    """MQAR examples for ``mcsd-train data=mqar``: ``num_train`` training and ``num_val``
    validation and test examples of one ``(seq_len, num_pairs)``, each split drawn from its
    own seed derived from ``seed``. Batches hold ``input_ids`` and aligned ``labels`` (the
    model's output at position ``t`` is scored against ``labels[t]``; no tokenizer). With
    ``fresh_examples``, every pass over the training split draws ``num_train`` new examples
    (the first pass: the fixed split), so that a model cannot lower its training loss by
    memorising them; validation and test stay fixed."""

    tokenizer = None  # MQAR's tokens are ids: nothing to save with the model
    accuracy_metric = "mqar_acc"  # logged as <stage>/mqar_acc

    def __init__(self, vocab_size: int = 8192, seq_len: int = 64, num_pairs: int = 4, num_train: int = 20000,
                 num_val: int = 1000, power_a: float = 0.01, batch_size: int = 64, seed: int = 0,
                 num_workers: int = 0, token_budget: int | None = None, name: str = "mqar",
                 fresh_examples: bool = False) -> None:
        super().__init__()
        check_split_sizes(num_train, num_val, batch_size, token_budget)
        self.save_hyperparameters(logger=False)
        self.splits: dict[str, LabelledExamples] = {}

    def build(self) -> dict[str, LabelledExamples]:
        """Draw the three splits (idempotent; fails in one line on a (T, K, V) that cannot work)."""
        if not self.splits:
            h = self.hparams
            seeds = np.random.SeedSequence(h.seed).spawn(3)
            counts = {"train": h.num_train, "val": h.num_val, "test": h.num_val}
            for (split, count), split_seed in zip(counts.items(), seeds):
                seed = int(split_seed.generate_state(1)[0])
                task = dict(seq_len=h.seq_len, num_pairs=h.num_pairs, vocab_size=h.vocab_size, power_a=h.power_a)
                self.splits[split] = (_FreshExamples(count, seed, **task) if split == "train" and h.fresh_examples
                                      else LabelledExamples(*mqar_examples(count, seed=seed, **task)))
        return self.splits
