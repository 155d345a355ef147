"""Retrieval past the training length, as token tasks made from a seed with no download: the
passkey test (Mohtashami and Jaggi 2023), RULER's needle in a haystack and variable tracking
(Hsieh et al. 2024), with their words replaced by ids, so that a model trained on them at one
length can be asked at 1x-4x that length.

Every generator returns ``(inputs, labels)``, ``(num_examples, seq_len)`` int64, a function of its
arguments alone; the output at position ``t`` is scored against ``labels[t]`` and only the
answer's positions are labelled (``IGNORE_INDEX`` elsewhere), in training as at test. Ids: the
answer's alphabet first (digits ``0..9``; variable tracking's variables after them), then the
haystack's filler, then the markers as the last ids. The haystack is RULER's ``repeat`` (one
filler "sentence" of the filler ids in order, repeated: nothing in it to remember) or ``noise``
(filler ids drawn uniformly).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mcsd.data.corpus import DataError
from mcsd.data.mqar import IGNORE_INDEX

DIGITS = 10  # ids 0..9: the passkey's, the needles' values and the variables' values
HAYSTACKS = ("repeat", "noise")


def _haystack(rng: np.random.Generator, haystack: str, length: int, first: int, end: int) -> np.ndarray:
    """``length`` filler ids from ``[first, end)``: the ids in order, repeated, or uniform."""
    if haystack not in HAYSTACKS:
        raise DataError(f"data.haystack={haystack!r} is unknown: use one of {', '.join(HAYSTACKS)}")
    if end <= first:
        raise DataError(f"data.vocab_size leaves no filler ids (they would be {first}..{end - 1}): raise vocab_size")
    if haystack == "repeat":
        return first + np.arange(length) % (end - first)
    return rng.integers(first, end, length)


def _placed(rng: np.random.Generator, room: int, pieces: list[list[int]], filler: np.ndarray) -> np.ndarray:
    """``pieces`` in their order at uniform places among ``room`` positions (none overlapping),
    the filler around them: ``[room]``."""
    free = room - sum(len(piece) for piece in pieces)
    gaps = np.sort(rng.integers(0, free + 1, len(pieces)))  # filler tokens before each piece
    out, taken = [], 0
    for gap, piece in zip(gaps, pieces):
        out += filler[taken:gap].tolist() + piece
        taken = gap
    return np.array(out + filler[taken:free].tolist())


def _check_room(seq_len: int, needed: int, setting: str) -> None:
    if seq_len < needed:
        raise DataError(f"data.seq_len={seq_len} is too short for {setting}: it needs at least {needed} tokens")


def _examples(rows: list[tuple[list[int], int]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``seq_len + 1`` tokens whose last ``n`` are the answer -> inputs and labels (the
    next token at each of the answer's positions)."""
    tokens = np.array([row for row, _ in rows], dtype=np.int64)
    labels = np.full((len(rows), seq_len), IGNORE_INDEX, dtype=np.int64)
    for index, (row, answer_length) in enumerate(rows):
        labels[index, -answer_length:] = row[-answer_length:]
    return torch.from_numpy(tokens[:, :-1]), torch.from_numpy(labels)


def passkey(
    num_examples: int, seq_len: int = 256, vocab_size: int = 32, seed: int = 0, digits: int = 5,
    haystack: str = "repeat",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A passkey of ``digits`` digits after the key marker, at a uniform depth of the haystack;
    at the end the query marker and the passkey again, labelled. Markers: key ``V - 2``, query
    ``V - 1``."""
    _check_room(seq_len, 2 * digits + 2, f"a passkey of digits={digits}")
    rng = np.random.default_rng(seed)
    key, query = vocab_size - 2, vocab_size - 1
    rows = []
    for _ in range(num_examples):
        code = rng.integers(0, DIGITS, digits).tolist()
        room = seq_len + 1 - (1 + digits)
        filler = _haystack(rng, haystack, room, DIGITS, vocab_size - 2)
        rows.append(([*_placed(rng, room, [[key, *code]], filler), query, *code], digits))
    return _examples(rows, seq_len)


def needle(
    num_examples: int, seq_len: int = 256, vocab_size: int = 64, seed: int = 0, num_needles: int = 1,
    key_ids: int = 16, value_digits: int = 3, haystack: str = "noise",
) -> tuple[torch.Tensor, torch.Tensor]:
    """RULER's needle in a haystack (one needle: its S-NIAH; several: its multi-key needle):
    ``num_needles`` needles (the needle marker, a key of one id of ``key_ids``, distinct among the
    needles, and a value of ``value_digits`` digits) at uniform depths, then the query marker, one
    of the keys (uniform) and its value, labelled.
    Ids: digits, keys, filler, needle ``V - 2``, query ``V - 1``."""
    if not 1 <= num_needles <= key_ids:
        raise DataError(f"data.num_needles={num_needles} must be between 1 and key_ids={key_ids} (distinct keys)")
    _check_room(seq_len, num_needles * (2 + value_digits) + 2 + value_digits, f"num_needles={num_needles}")
    rng = np.random.default_rng(seed)
    marker, query = vocab_size - 2, vocab_size - 1
    rows = []
    for _ in range(num_examples):
        keys = DIGITS + rng.permutation(key_ids)[:num_needles]
        values = rng.integers(0, DIGITS, (num_needles, value_digits))
        asked = int(rng.integers(num_needles))
        room = seq_len + 1 - (2 + value_digits)
        filler = _haystack(rng, haystack, room, DIGITS + key_ids, vocab_size - 2)
        needles = [[marker, int(key), *value.tolist()] for key, value in zip(keys, values)]
        rows.append(([*_placed(rng, room, needles, filler), query, int(keys[asked]), *values[asked].tolist()],
                     value_digits))
    return _examples(rows, seq_len)


def variable_tracking(
    num_examples: int, seq_len: int = 256, vocab_size: int = 64, seed: int = 0, num_chains: int = 1,
    num_hops: int = 4, variable_ids: int = 26, value_digits: int = 3, haystack: str = "noise",
) -> tuple[torch.Tensor, torch.Tensor]:
    """RULER's variable tracking: each chain assigns a value of ``value_digits`` digits to a first
    variable (the assign marker, the variable, the value), then ``num_hops`` times one more
    variable to the one before (the assign marker, the new variable, the old one), its statements
    in order at uniform depths among the other chains' and the haystack; at the end the query
    marker, the first chain's value, and its ``num_hops + 1`` variables in the order they were
    assigned, labelled. Chains' values differ; every variable is distinct. Ids: digits, variables,
    filler, assign ``V - 2``, query ``V - 1``."""
    variables_needed = num_chains * (num_hops + 1)
    if num_chains < 1 or num_hops < 0 or variables_needed > variable_ids:
        raise DataError(f"data.num_chains={num_chains} x (num_hops={num_hops} + 1) variables exceed variable_ids="
                        f"{variable_ids}: lower them or raise variable_ids")
    if num_chains > DIGITS**value_digits:
        raise DataError(f"data.num_chains={num_chains} needs as many distinct values of value_digits={value_digits}")
    statements = num_chains * (3 + value_digits + 3 * num_hops)
    _check_room(seq_len, statements + 1 + value_digits + num_hops + 1, f"num_chains={num_chains}, num_hops={num_hops}")
    rng = np.random.default_rng(seed)
    assign, query = vocab_size - 2, vocab_size - 1
    rows = []
    for _ in range(num_examples):
        names = (DIGITS + rng.permutation(variable_ids)[:variables_needed]).reshape(num_chains, num_hops + 1).tolist()
        numbers = rng.choice(DIGITS**value_digits, num_chains, replace=False)
        values = [[int(digit) for digit in np.base_repr(int(number), DIGITS).zfill(value_digits)] for number in numbers]
        chains = [[[assign, chain[0], *value]] + [[assign, new, old] for old, new in zip(chain, chain[1:])]
                  for chain, value in zip(names, values)]
        order = rng.permutation(np.repeat(np.arange(num_chains), num_hops + 1))  # whose statement comes next
        next_of = [0] * num_chains
        pieces = []
        for chain in order:
            pieces.append(chains[chain][next_of[chain]])
            next_of[chain] += 1
        answer = names[0]
        room = seq_len + 1 - (1 + value_digits + len(answer))
        filler = _haystack(rng, haystack, room, DIGITS + variable_ids, vocab_size - 2)
        rows.append(([*_placed(rng, room, pieces, filler), query, *values[0], *answer], len(answer)))
    return _examples(rows, seq_len)


RETRIEVAL_TASKS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "passkey": passkey,
    "needle": needle,
    "variable_tracking": variable_tracking,
}
"""The retrieval tasks by name: each ``task(num_examples, seq_len, vocab_size, seed, **settings)``."""
