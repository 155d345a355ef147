"""Retrieval tasks (mcsd/data/retrieval.py): each generator against its definition, at 1x-4x a
length, its seed, and its refusals."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

from mcsd.data.corpus import DataError
from mcsd.data.mqar import IGNORE_INDEX
from mcsd.data.retrieval import DIGITS, RETRIEVAL_TASKS


def digest(*tensors: torch.Tensor) -> str:
    return hashlib.sha256(b"".join(tensor.numpy().tobytes() for tensor in tensors)).hexdigest()


def answer_of(row_labels: list[int]) -> list[int]:
    return [label for label in row_labels if label != IGNORE_INDEX]


@pytest.mark.parametrize("name", sorted(RETRIEVAL_TASKS))
@pytest.mark.parametrize("scale", [1, 4])
def test_examples_are_a_function_of_the_seed_at_every_length(name: str, scale: int) -> None:
    """Identical for one seed, different for another; exactly ``seq_len`` tokens at 1x and 4x;
    only the answer's last positions labelled, each label the next input."""
    task = RETRIEVAL_TASKS[name]
    first, again, other = (task(16, seq_len=128 * scale, seed=seed) for seed in (7, 7, 8))
    assert digest(*first) == digest(*again) != digest(*other)
    inputs, labels = first
    assert inputs.shape == labels.shape == (16, 128 * scale) and inputs.dtype == labels.dtype == torch.int64
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        answer = answer_of(row_labels)
        assert answer and row_labels[-len(answer):] == answer
        assert row[-len(answer) + 1:] == answer[:-1]  # teacher-forced: each answer token is the next input


@pytest.mark.parametrize("haystack", ["repeat", "noise"])
def test_the_passkey_is_hidden_once_at_any_depth_and_asked_at_the_end(haystack: str) -> None:
    """The key marker appears once, followed by the code that the labels ask for; no digit in the
    haystack; the marker's depth covers the whole haystack over examples."""
    vocab = 32
    inputs, labels = RETRIEVAL_TASKS["passkey"](400, seq_len=96, vocab_size=vocab, seed=0, haystack=haystack)
    depths = set()
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        code = answer_of(row_labels)
        assert len(code) == 5 and row.count(vocab - 2) == 1 and row.count(vocab - 1) == 1
        at = row.index(vocab - 2)
        assert row[at + 1:at + 6] == code and row[-5] == vocab - 1
        haystack_ids = row[:at] + row[at + 6:-5]
        assert all(DIGITS <= token < vocab - 2 for token in haystack_ids)
        depths.add(at)
    assert min(depths) <= 3 and max(depths) >= 96 - 5 - 6 - 3


def test_the_needle_asked_for_is_one_of_several_distinct_keys() -> None:
    """Four needles (marker, a distinct key, a 3-digit value); the query asks one key, and the
    labels are that needle's value; the haystack holds neither digits, keys nor markers."""
    vocab, key_ids = 64, 16
    inputs, labels = RETRIEVAL_TASKS["needle"](300, seq_len=128, vocab_size=vocab, seed=1, num_needles=4)
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        value = answer_of(row_labels)
        prompt = row[:-4]  # then the query marker, the key asked and the value's first two digits
        starts = [i for i, token in enumerate(prompt) if token == vocab - 2]
        needles = {prompt[i + 1]: prompt[i + 2:i + 5] for i in starts}
        assert len(starts) == len(needles) == 4 and all(DIGITS <= key < DIGITS + key_ids for key in needles)
        assert row[-4] == vocab - 1 and needles[row[-3]] == value
        covered = {i + offset for i in starts for offset in range(5)}
        assert all(DIGITS + key_ids <= token < vocab - 2 for i, token in enumerate(prompt) if i not in covered)


@pytest.mark.parametrize(("num_chains", "num_hops"), [(1, 4), (3, 2)])
def test_variable_tracking_answers_every_variable_of_the_value_in_order(num_chains: int, num_hops: int) -> None:
    """Following the statements in the inputs (a value to a variable, a variable to another)
    gives the answer: the variables holding the queried value, in the order of assignment."""
    vocab, digits = 64, 3
    inputs, labels = RETRIEVAL_TASKS["variable_tracking"](200, seq_len=160, vocab_size=vocab, seed=2,
                                                          num_chains=num_chains, num_hops=num_hops)
    for row, row_labels in zip(inputs.tolist(), labels.tolist()):
        answer = answer_of(row_labels)
        query_at = row.index(vocab - 1)
        asked = row[query_at + 1:query_at + 1 + digits]
        value_of, order = {}, []
        for i, token in enumerate(row[:query_at]):
            if token != vocab - 2:
                continue
            name, source = row[i + 1], row[i + 2]
            value_of[name] = row[i + 2:i + 2 + digits] if source < DIGITS else value_of[source]
            order.append(name)
        assert len(order) == len(set(order)) == num_chains * (num_hops + 1)
        assert answer == [name for name in order if value_of[name] == asked]
        assert len({tuple(value) for value in value_of.values()}) == num_chains


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("passkey", {"seq_len": 11}, "data.seq_len=11 is too short for a passkey of digits=5: it needs at least 12 tokens"),
    ("passkey", {"haystack": "essay"}, "data.haystack='essay' is unknown: use one of repeat, noise"),
    ("passkey", {"vocab_size": 12}, "data.vocab_size leaves no filler ids"),
    ("needle", {"num_needles": 17}, "data.num_needles=17 must be between 1 and key_ids=16"),
    ("variable_tracking", {"num_chains": 6}, "data.num_chains=6 x (num_hops=4 + 1) variables exceed variable_ids=26"),
])
def test_impossible_settings_fail_in_one_line(name: str, settings: dict, message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)) as failure:
        RETRIEVAL_TASKS[name](2, **settings)
    assert "\n" not in str(failure.value)
