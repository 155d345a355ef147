"""MAD's six token-manipulation tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures"), made from a seed with no download.

Each generator returns ``(inputs, labels)``, ``(num_examples, seq_len)`` int64, a function of its
arguments alone: the model's output at position ``t`` is scored against ``labels[t]``, and a label
of ``IGNORE_INDEX`` is not scored (as in :mod:`mcsd.data.mqar`). The tasks follow MAD's definitions
(its ``mad/data/instances.py``), written again vectorised over examples; where this version differs
its docstring says so. The vocabulary's special tokens are its last ids.

``split``: ``"train"`` or ``"test"``. For the three recall tasks MAD trains on every next token
(the model learns the pairs' format too) and scores only the probe's value at test; the other
three score the same positions in both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mcsd.data.corpus import DataError
from mcsd.data.mqar import IGNORE_INDEX

SPLITS = ("train", "test")


def _check(split: str, **minimums: tuple[int, int, str]) -> None:
    """One line naming the setting and the fix for a split, or a setting (``name=(value, minimum,
    why)``) below what the task can take."""
    if split not in SPLITS:
        raise DataError(f"split={split!r} is unknown: use one of {', '.join(SPLITS)}")
    for setting, (value, minimum, why) in minimums.items():
        if value < minimum:
            raise DataError(f"data.{setting}={value} is below {minimum}: {why}")


def _shifted(tokens: np.ndarray, test_labels: np.ndarray, split: str,
             train_targets: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` ``[n, seq_len + 1]`` -> inputs (all but the last) and labels: every next token
    of ``train_targets`` (by default ``tokens``) for ``train``, ``test_labels[:, 1:]`` for ``test``
    (both ``[n, seq_len + 1]``, aligned with ``tokens``)."""
    labels = (tokens if train_targets is None else train_targets) if split == "train" else test_labels
    return (torch.from_numpy(tokens[:, :-1].astype(np.int64)),
            torch.from_numpy(np.ascontiguousarray(labels[:, 1:], dtype=np.int64)))


def in_context_recall(
    num_examples: int, seq_len: int = 128, vocab_size: int = 16, seed: int = 0, split: str = "train",
    noise_vocab_size: int = 0, frac_noise: float = 0.0, multi_query: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-value pairs ``k v`` (keys from the first half of the non-special vocabulary, values
    from the second; a key met again keeps its value), the last pair's key one already presented
    (uniformly among them). ``multi_query`` (MAD's default): at test every pair whose key was
    presented before is scored, its value read at the key; ``seq_len`` tokens of pairs. Single
    query: the copy token (the last id) comes before the last pair, whose value alone is scored.
    With ``frac_noise``, each pair's two tokens are noise (from ``noise_vocab_size`` ids after the
    values) with that probability, one pair excepted. ``seq_len`` must be even (pairs of two).
    MAD's multi-query sequences are one token shorter (``seq_len - 1``: the last value is their
    last label, never an input); here the last value is also the last input, unscored."""
    _check(split, seq_len=(seq_len, 4, "in-context recall needs a pair and its query: raise it"))
    if seq_len % 2:
        raise DataError(f"data.seq_len={seq_len} must be even for in-context recall (pairs of two tokens)")
    specials = 0 if multi_query else 1  # the copy token
    half = (vocab_size - specials - noise_vocab_size) // 2
    if half < 1:
        raise DataError(f"data.vocab_size={vocab_size} leaves no keys beside noise_vocab_size={noise_vocab_size} "
                        "and the special tokens: raise vocab_size")
    if not 0 <= frac_noise < 1 or (frac_noise > 0 and noise_vocab_size < 1):
        raise DataError(f"data.frac_noise={frac_noise} must be in [0, 1), with noise_vocab_size > 0 when above 0")
    rng = np.random.default_rng(seed)
    slots = seq_len // 2 - 1  # pairs before the probe pair (single query: and the copy token)
    rows = np.arange(num_examples)[:, None]
    keys = rng.integers(0, half, (num_examples, slots))
    value_of = rng.integers(half, 2 * half, (num_examples, half))  # each example's own map
    pairs = np.stack([keys, value_of[rows, keys]], axis=-1)
    noisy = rng.random((num_examples, slots)) < frac_noise
    noisy[rows[:, 0], rng.integers(0, slots, num_examples)] = False  # at least one pair
    noise = rng.integers(2 * half, 2 * half + max(noise_vocab_size, 1), (num_examples, slots, 2))
    pairs = np.where(noisy[..., None], noise, pairs)
    presented = np.zeros((num_examples, half), dtype=bool)
    repeated = np.zeros((num_examples, slots + 1), dtype=bool)  # a pair whose key came before
    for slot in range(slots):
        real = ~noisy[:, slot]
        repeated[:, slot] = real & presented[rows[:, 0], keys[:, slot]]
        presented[rows[real, 0], keys[real, slot]] = True
    probe = np.where(presented, rng.random((num_examples, half)), -1.0).argmax(1)  # uniform among presented
    repeated[:, slots] = True
    probe_pair = np.stack([probe, value_of[rows[:, 0], probe]], 1)
    copy = [] if multi_query else [np.full((num_examples, 1), vocab_size - 1)]
    tokens = np.concatenate([pairs.reshape(num_examples, -1), *copy, probe_pair,
                             np.full((num_examples, 1 - specials), IGNORE_INDEX)], 1)  # [n, seq_len + 1]
    test_labels = np.full(tokens.shape, IGNORE_INDEX)
    if multi_query:  # each repeated pair's value, aligned with it (the shift puts it at the key)
        values = test_labels[:, :seq_len].reshape(num_examples, slots + 1, 2)
        values[..., 1] = np.where(repeated, tokens[:, :seq_len].reshape(num_examples, slots + 1, 2)[..., 1],
                                  IGNORE_INDEX)
        test_labels[:, :seq_len] = values.reshape(num_examples, seq_len)
    else:
        test_labels[:, -1] = tokens[:, -1]
    return _shifted(tokens, test_labels, split)


def noisy_in_context_recall(
    num_examples: int, seq_len: int = 128, vocab_size: int = 32, seed: int = 0, split: str = "train",
    noise_vocab_size: int = 16, frac_noise: float = 0.2, multi_query: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`in_context_recall` with noise pairs among the key-value pairs (MAD's defaults: 16
    noise ids of a vocabulary of 32, a fifth of the pairs noise)."""
    return in_context_recall(num_examples, seq_len, vocab_size, seed, split, noise_vocab_size, frac_noise, multi_query)


def fuzzy_in_context_recall(
    num_examples: int, seq_len: int = 128, vocab_size: int = 16, seed: int = 0, split: str = "train",
    key_motif_size: int = 3, value_motif_size: int = 3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-context recall whose keys and values are motifs of 1 to ``key_motif_size`` (values: 1
    to ``value_motif_size``) distinct adjacent tokens, so a key's extent must be inferred: pairs,
    among them the probe pair once, then the copy token, the probe key and its value, padded at
    the front with the pad token to ``seq_len + 1`` tokens. At test every key has the largest
    size and the labels are the probe value's tokens. Ids: keys, values, then pad and copy. As
    MAD, except that the training labels skip the padding."""
    _check(split)
    half = (vocab_size - 2) // 2
    if half < max(key_motif_size, value_motif_size) or min(key_motif_size, value_motif_size) < 1:
        raise DataError(f"data.vocab_size={vocab_size} has {max(half, 0)} keys and values each: motifs of up to "
                        f"{max(key_motif_size, value_motif_size)} distinct tokens need at least as many: raise it")
    longest = key_motif_size + value_motif_size
    if seq_len + 1 < 1 + 2 * longest + longest:
        raise DataError(f"data.seq_len={seq_len} has no room for a pair, the probe pair and the query "
                        f"(motifs of up to {key_motif_size} + {value_motif_size} tokens): raise it to {3 * longest}")
    rng = np.random.default_rng(seed)
    pad, copy = vocab_size - 2, vocab_size - 1
    key_sizes = np.arange(1, key_motif_size + 1) if split == "train" else np.array([key_motif_size])

    def motif(first: int, size: int) -> tuple[int, ...]:
        return tuple(int(token) for token in first + rng.permutation(half)[:size])

    tokens = np.full((num_examples, seq_len + 1), pad)
    test_labels = np.full((num_examples, seq_len + 1), IGNORE_INDEX)
    padding = np.zeros((num_examples, seq_len + 1), dtype=bool)
    for row in range(num_examples):
        probe_key = motif(0, int(rng.choice(key_sizes)))
        probe_value = motif(half, int(rng.integers(1, value_motif_size + 1)))
        query = (copy, *probe_key, *probe_value)
        room = seq_len + 1 - len(query)
        probe_at = int(rng.integers(0, room - 2 * longest + 1))
        value_of: dict[tuple[int, ...], tuple[int, ...]] = {probe_key: probe_value}
        body: list[int] = []
        while True:
            if probe_at is not None and len(body) >= probe_at:
                body += [*probe_key, *probe_value]
                probe_at = None
                continue
            key = motif(0, int(rng.choice(key_sizes)))
            value = value_of.setdefault(key, motif(half, int(rng.integers(1, value_motif_size + 1))))
            if len(body) + len(key) + len(value) + (0 if probe_at is None else len(probe_key) + len(probe_value)) > room:
                break
            body += [*key, *value]
        if probe_at is not None:
            body += [*probe_key, *probe_value]
        sequence = body + list(query)
        tokens[row, -len(sequence):] = sequence
        padding[row, :-len(sequence)] = True
        test_labels[row, -len(probe_value):] = probe_value
    return _shifted(tokens, test_labels, split, train_targets=np.where(padding, IGNORE_INDEX, tokens))


def selective_copying(
    num_examples: int, seq_len: int = 256, vocab_size: int = 16, seed: int = 0, split: str = "train",
    num_tokens_to_copy: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_tokens_to_copy`` tokens scattered among blanks, then the copy token and as many
    blanks, at which the labels are the scattered tokens in order. Ids: data tokens, then blank
    and copy. The tokens' places are uniform among the first ``seq_len - num_tokens_to_copy - 1``
    positions (MAD inserts its blanks before random tokens, never after the last one)."""
    _check(split, vocab_size=(vocab_size, 3, "selective copying needs a data token, a blank and the copy token"))
    span = seq_len - num_tokens_to_copy - 1  # the tokens and the blanks among them
    if num_tokens_to_copy < 1 or span <= num_tokens_to_copy:
        raise DataError(f"data.seq_len={seq_len} must exceed 2 * num_tokens_to_copy + 1 = {2 * num_tokens_to_copy + 1} "
                        f"(num_tokens_to_copy={num_tokens_to_copy} >= 1): raise seq_len or lower num_tokens_to_copy")
    rng = np.random.default_rng(seed)
    blank, copy = vocab_size - 2, vocab_size - 1
    to_copy = rng.integers(0, vocab_size - 2, (num_examples, num_tokens_to_copy))
    places = np.sort(rng.random((num_examples, span)).argsort(1)[:, :num_tokens_to_copy], axis=1)
    inputs = np.full((num_examples, seq_len), blank)
    inputs[np.arange(num_examples)[:, None], places] = to_copy
    inputs[:, span] = copy
    labels = np.full((num_examples, seq_len), IGNORE_INDEX)
    labels[:, span + 1:] = to_copy
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))


def compression(
    num_examples: int, seq_len: int = 32, vocab_size: int = 16, seed: int = 0, split: str = "train",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``seq_len - 1`` uniform tokens, then the compression token (the last id); the labels are
    the inputs themselves, to be reconstructed from the model's output at the compression token
    alone (MAD reads it with a decoder MLP given each position's embedding): a model scored at
    each position against its own input would see the answer."""
    _check(split, seq_len=(seq_len, 2, "compression needs a token and the compression token"),
           vocab_size=(vocab_size, 2, "compression needs a data token and the compression token"))
    rng = np.random.default_rng(seed)
    inputs = np.concatenate([rng.integers(0, vocab_size - 1, (num_examples, seq_len - 1)),
                             np.full((num_examples, 1), vocab_size - 1)], 1).astype(np.int64)
    return torch.from_numpy(inputs), torch.from_numpy(inputs.copy())


def memorization_map(vocab_size: int, map_seed: int = 12345) -> np.ndarray:
    """The fixed value of each key of :func:`memorization` (keys ``0 .. h - 1`` for ``h =
    (vocab_size - 1) // 2``, values a permutation of ``h .. 2h - 1``), the same for every example
    and split: what the model must hold in its weights."""
    half = (vocab_size - 1) // 2
    return half + np.random.default_rng(map_seed).permutation(half)


def memorization(
    num_examples: int, seq_len: int = 32, vocab_size: int = 256, seed: int = 0, split: str = "train",
    map_seed: int = 12345,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys each followed by the insert token (the last id), at which the label is the key's
    fixed value (:func:`memorization_map`): nothing in the sequence says it. ``seq_len`` even."""
    _check(split, seq_len=(seq_len, 2, "memorization needs a key and the insert token"),
           vocab_size=(vocab_size, 3, "memorization needs a key, a value and the insert token"))
    if seq_len % 2:
        raise DataError(f"data.seq_len={seq_len} must be even for memorization (a key and the insert token)")
    rng = np.random.default_rng(seed)
    value_of = memorization_map(vocab_size, map_seed)
    keys = rng.integers(0, len(value_of), (num_examples, seq_len // 2))
    inputs = np.stack([keys, np.full_like(keys, vocab_size - 1)], -1).reshape(num_examples, seq_len)
    labels = np.stack([np.full_like(keys, IGNORE_INDEX), value_of[keys]], -1).reshape(num_examples, seq_len)
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))


MAD_TASKS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "in_context_recall": in_context_recall,
    "fuzzy_in_context_recall": fuzzy_in_context_recall,
    "noisy_in_context_recall": noisy_in_context_recall,
    "selective_copying": selective_copying,
    "compression": compression,
    "memorization": memorization,
}
"""MAD's six tasks by name: each ``task(num_examples, seq_len, vocab_size, seed, split, **settings)``."""


def recall_by_frequency(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example, the accuracy of multi-query in-context recall answered without recall: at each
    scored key, the value seen most often so far in the example (ties: the lowest id). What a
    model that learned the values' in-context frequencies but not which key they follow scores:
    the bar an architecture must pass before its accuracy says anything about recall."""
    examples, length = inputs.shape
    values = inputs[:, 1::2]  # pairs: each key at an even position, its value after it
    counts = torch.zeros(examples, int(inputs.max()) + 1, dtype=torch.long)
    right = torch.zeros(examples)
    scored = (labels != IGNORE_INDEX).sum(1).clamp(min=1)
    for pair in range(length // 2):
        label = labels[:, 2 * pair]
        asked = label != IGNORE_INDEX
        right += (asked & (counts.argmax(1) == label)).float()
        counts[torch.arange(examples), values[:, pair]] += 1
    return right / scored
