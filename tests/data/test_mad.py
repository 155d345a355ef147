"""MAD's six tasks (mcsd/data/mad.py): each generator against its definition, its seed, and its refusals."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

from mcsd.data.corpus import DataError
from mcsd.data.mad import MAD_TASKS, memorization_map, recall_by_frequency
from mcsd.data.mqar import IGNORE_INDEX


def digest(*tensors: torch.Tensor) -> str:
    return hashlib.sha256(b"".join(tensor.numpy().tobytes() for tensor in tensors)).hexdigest()


@pytest.mark.parametrize("name", sorted(MAD_TASKS))
def test_examples_are_a_function_of_the_seed_and_have_their_length(name: str) -> None:
    task = MAD_TASKS[name]
    first, again, other = task(64, seed=3), task(64, seed=3), task(64, seed=4)
    assert digest(*first) == digest(*again) != digest(*other)
    inputs, labels = first
    assert inputs.dtype == labels.dtype == torch.int64 and inputs.shape == labels.shape and inputs.shape[0] == 64
    assert inputs.shape[1] == task.__defaults__[0]  # the default seq_len
    assert (labels != IGNORE_INDEX).any(1).all()  # every example scores something


@pytest.mark.parametrize("multi_query", [True, False], ids=["multi_query", "single_query"])
@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_in_context_recall_asks_presented_keys_for_their_values(noise: float, multi_query: bool) -> None:
    """Every pair of a key has one value in an example; noise pairs hold noise ids only, in about
    ``frac_noise`` of the pairs; the last pair's key was presented before. Test labels: multi-query,
    at every key presented before (and nowhere else), its value; single query, the last position
    alone, after the copy token. Training labels: the next tokens."""
    vocab, noise_ids = 32, 8 if noise else 0
    keys = (vocab - (0 if multi_query else 1) - noise_ids) // 2
    settings = dict(seq_len=64, vocab_size=vocab, seed=0, noise_vocab_size=noise_ids, frac_noise=noise,
                    multi_query=multi_query)
    inputs, labels = MAD_TASKS["in_context_recall"](500, split="test", **settings)
    train_inputs, train_labels = MAD_TASKS["in_context_recall"](500, **settings)
    assert torch.equal(train_inputs, inputs) and torch.equal(train_labels[:, :-1], inputs[:, 1:])
    noise_pairs = 0
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        # multi-query: 31 pairs, then the probe pair; single: 31 pairs, the copy token, the probe key
        pairs = list(zip(row[::2], row[1::2])) if multi_query else [*zip(row[:-2:2], row[1:-2:2]), (row[-1], None)]
        seen, expected = {}, []
        for key, value in pairs:
            if key >= 2 * keys:  # a noise pair
                assert 2 * keys <= value < 2 * keys + noise_ids
                noise_pairs += 1
                expected += [IGNORE_INDEX, IGNORE_INDEX]
                continue
            expected += [seen[key] if key in seen else IGNORE_INDEX, IGNORE_INDEX]
            assert value is None or (keys <= value < 2 * keys and seen.setdefault(key, value) == value)
        assert expected[-2] != IGNORE_INDEX  # the probe's key was presented
        if multi_query:
            assert row_labels == expected
        else:
            assert row[-2] == vocab - 1 and row_labels == [IGNORE_INDEX] * 63 + [expected[-2]]
    assert noise_pairs / (500 * 31) == pytest.approx(noise * 30 / 31, abs=0.02)  # one pair of 31 is never noise


def test_fuzzy_in_context_recall_asks_for_a_motif_presented_before() -> None:
    """The probe pair (key and value motifs of distinct ids) stands earlier in the sequence as it
    is asked; padding only at the front (not labelled in training); test keys of the largest size;
    test labels the value's tokens, read from the key's last token on."""
    vocab, pad, copy = 16, 14, 15
    for split in ("train", "test"):
        inputs, labels = MAD_TASKS["fuzzy_in_context_recall"](200, seq_len=64, vocab_size=vocab, seed=1, split=split)
        for row, row_labels in zip(inputs.tolist(), labels.tolist()):
            start = row.index(copy)
            assert all(token == pad for token in row[:next(i for i, t in enumerate(row) if t != pad)])
            assert pad not in row[row.index(next(t for t in row if t != pad)):]
            query = row[start + 1:]
            if split == "test":
                answer = [label for label in row_labels if label != IGNORE_INDEX]
                key = query[:len(query) - len(answer) + 1]
                assert len(key) == 3 and all(token < 7 for token in key) and all(7 <= token < 14 for token in answer)
                assert len(set(key)) == len(key) and len(set(answer)) == len(answer)
                pair = key + answer
                assert any(row[i:i + len(pair)] == pair for i in range(start - len(pair) + 1))
                assert row_labels[-len(answer):] == answer and row_labels[:-len(answer)] == [IGNORE_INDEX] * (64 - len(answer))
            else:
                padding = next(i for i, t in enumerate(row) if t != pad)
                assert row_labels[:max(padding - 1, 0)] == [IGNORE_INDEX] * max(padding - 1, 0)
                assert row_labels[padding:-1] == row[padding + 1:]


def test_selective_copying_labels_the_scattered_tokens_in_order() -> None:
    inputs, labels = MAD_TASKS["selective_copying"](300, seq_len=48, vocab_size=10, seed=2, num_tokens_to_copy=6)
    blank, copy, span = 8, 9, 48 - 6 - 1
    places = set()
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        scattered = [token for token in row[:span] if token != blank]
        assert len(scattered) == 6 and all(token < blank for token in scattered)
        assert row[span] == copy and row[span + 1:] == [blank] * 6
        assert row_labels[span + 1:] == scattered and row_labels[:span + 1] == [IGNORE_INDEX] * (span + 1)
        places.update(i for i, token in enumerate(row[:span]) if token != blank)
    assert places == set(range(span))  # any place of the span, the first and the last included


def test_compression_labels_are_the_inputs_ending_in_the_compression_token() -> None:
    inputs, labels = MAD_TASKS["compression"](100, seq_len=20, vocab_size=12, seed=0)
    assert torch.equal(inputs, labels) and (inputs[:, -1] == 11).all() and (inputs[:, :-1] < 11).all()


def test_memorization_labels_each_key_with_its_fixed_value_whatever_the_seed_and_split() -> None:
    """The map is one bijection from keys to values, the same in every example, seed and split;
    the label sits at the insert token after the key."""
    value_of = memorization_map(64)
    assert sorted(value_of.tolist()) == list(range(31, 62))
    for seed, split in ((0, "train"), (5, "test")):
        inputs, labels = MAD_TASKS["memorization"](50, seq_len=16, vocab_size=64, seed=seed, split=split)
        assert (inputs[:, 1::2] == 63).all() and (labels[:, ::2] == IGNORE_INDEX).all()
        assert torch.equal(labels[:, 1::2], torch.from_numpy(value_of)[inputs[:, ::2]])


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("in_context_recall", {"seq_len": 63}, "data.seq_len=63 must be even"),
    ("in_context_recall", {"vocab_size": 1}, "data.vocab_size=1 leaves no keys"),
    ("in_context_recall", {"frac_noise": 0.5}, "data.frac_noise=0.5 must be in [0, 1), with noise_vocab_size > 0"),
    ("fuzzy_in_context_recall", {"seq_len": 16}, "data.seq_len=16 has no room"),
    ("selective_copying", {"seq_len": 33}, "data.seq_len=33 must exceed 2 * num_tokens_to_copy + 1 = 33"),
    ("memorization", {"seq_len": 7}, "data.seq_len=7 must be even"),
    ("compression", {"split": "val"}, "split='val' is unknown: use one of train, test"),
])
def test_impossible_settings_fail_in_one_line(name: str, settings: dict, message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)) as failure:
        MAD_TASKS[name](4, **settings)
    assert "\n" not in str(failure.value)


def test_recall_by_frequency_answers_with_the_most_frequent_value_so_far() -> None:
    """Keys 0-1, values 2-3: at the third pair's key (0, value 2) the values seen are 2 and 3 once
    each (the tie goes to 2: right); at the fourth (1, value 3) 2 has been seen twice: wrong."""
    inputs = torch.tensor([[0, 2, 1, 3, 0, 2, 1, 3]])
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 2, IGNORE_INDEX, 3, IGNORE_INDEX]])
    assert recall_by_frequency(inputs, labels).tolist() == [0.5]
    inputs, labels = MAD_TASKS["in_context_recall"](400, seed=0, split="test")
    assert 0.25 < recall_by_frequency(inputs, labels).mean().item() < 0.4  # 8 values, drawn with replacement
