"""Model FLOPs of the sequence-mixing ops: the forward work of their sums over positions.

One rule for every op and form: a sum over positions costs 2 FLOPs (a multiply and an add)
per term and per output feature, counted as the form computes it. Parallel forms compute
their full ``N x N`` products (masked entries included), except attention's, one causal call
of ``scaled_dot_product_attention`` whose fused kernels skip the masked half: its
``N (N + 1) / 2`` terms (PaLM's appendix B counts the full ``N x N``, and so does
``FlopCounterMode``: an MFU over 1 was that difference); chunk forms their ``L x L`` products inside each
chunk (the last one ``r x r`` for ``N = q L + r``) plus the carried state's writes and reads;
recurrent forms their state updates and reads. Exponentials, masks, normalisations and the
carry of states from chunk to chunk (one update per chunk, not per token) are elementwise
work that the count leaves out, as ``torch.utils.flop_counter.FlopCounterMode`` does.
Every function returns the FLOPs of one batch row (one head or one set of channels as its
arguments say): per-token costs times the sequence, never a guess from parameter counts.
"""

from __future__ import annotations

from collections.abc import Callable

from mcsd.ops.common import check_form


def over_chunks(length: int, chunk_size: int, per_chunk: Callable[[int], int]) -> int:
    """``per_chunk(L)`` for each full chunk of ``length`` plus ``per_chunk(r)`` for the rest."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    full, rest = divmod(length, chunk_size)
    return full * per_chunk(chunk_size) + (per_chunk(rest) if rest else 0)


def attention_flops(length: int, key_width: int, value_width: int, form: str, chunk_size: int) -> int:
    """Softmax attention over a KV cache (one row; widths summed over heads): the scores
    (``key_width`` per term) and their sum of values (``value_width``). Parallel: every query
    against the keys up to itself, causal (``2 N (N + 1) d`` for equal widths: half of PaLM's
    12 L d N per token once with its backward); chunk: each block of queries against the keys up
    to its end; recurrent: each token against the keys up to itself."""
    check_form(form)
    width = key_width + value_width
    if form == "parallel":
        return length * (length + 1) * width
    block = 1 if form == "recurrent" else chunk_size
    full, rest = divmod(length, block)
    # Block b (of `block` queries) reads the (b + 1) * block keys up to its end.
    keys_read = block * block * full * (full + 1) // 2 + rest * length
    return 2 * keys_read * width


def decayed_attention_flops(length: int, key_width: int, value_width: int, form: str, chunk_size: int) -> int:
    """Decayed linear attention, one head (``dk``, ``dv``): parallel ``2 N^2 (dk + dv)``; chunk
    ``2 L^2 (dk + dv)`` inside each chunk plus the state's write (``k^T v``) and read (``q S``),
    ``2 dk dv`` each per token; recurrent the same write and read per token."""
    check_form(form)
    if form == "parallel":
        return 2 * length * length * (key_width + value_width)
    state = 4 * key_width * value_width
    if form == "recurrent":
        return length * state
    return over_chunks(length, chunk_size, lambda size: 2 * size * size * (key_width + value_width) + size * state)


def gla_flops(length: int, key_width: int, value_width: int, form: str, chunk_size: int) -> int:
    """Gated linear attention, one head (``dk``, ``dv``): decayed attention's sums
    (:func:`decayed_attention_flops`) plus the decays' product with the queries, ``N^2 dk`` in
    parallel (``L^2 dk`` inside each chunk); a token's decay of the state, ``dk dv``, in the chunk
    and recurrent forms."""
    check_form(form)
    if form == "parallel":
        return 2 * length * length * (key_width + value_width) + length * length * key_width
    state = 5 * key_width * value_width
    if form == "recurrent":
        return length * state
    return over_chunks(length, chunk_size, lambda size: 2 * size * size * (key_width + value_width)
                       + size * size * key_width + size * state)


def delta_rule_flops(length: int, key_width: int, value_width: int, form: str, chunk_size: int) -> int:
    """The gated delta rule, one head (``dk``, ``dv``), as its forms compute it
    (:mod:`mcsd.ops.delta_rule`). Chunk: inside each chunk of L the keys' products ``K K^T`` and the
    scores ``Q K^T`` (``2 L^2 dk`` each), the unit triangular solve for the written values and
    their state map (``L^2 (dk + dv)``), the scores times the values (``2 L^2 dv``), and per token
    the state's three products (``W S``, ``Q S``, ``K^T U``: ``2 dk dv`` each); parallel the same
    with one chunk of ``N``; recurrent per token the key's read of the state, the write and the
    query's read (``2 dk dv`` each)."""
    check_form(form)
    state = 6 * key_width * value_width
    if form == "recurrent":
        return length * state

    def per_chunk(size: int) -> int:
        return 4 * size * size * key_width + size * size * (key_width + value_width) + 2 * size * size * value_width \
            + size * state

    return per_chunk(length) if form == "parallel" else over_chunks(length, chunk_size, per_chunk)


def exp_filter_flops(length: int, width: int, form: str, chunk_size: int) -> int:
    """The exponential filter over ``width`` features (MCSD's section, every channel): parallel
    the ``N x N`` matrix times the values (``2 N^2`` per feature); chunk the ``L x L`` matrix in
    each chunk, each token's write into the carried state and the state's read at each token
    (``2 L^2 + 4 L`` per feature); recurrent the state's update per token (``2`` per feature)."""
    check_form(form)
    if form == "parallel":
        return 2 * length * length * width
    if form == "recurrent":
        return 2 * length * width
    return over_chunks(length, chunk_size, lambda size: (2 * size * size + 4 * size) * width)


def wkv_flops(length: int, channels: int, form: str, chunk_size: int) -> int:
    """RWKV-4's WKV over ``channels``: two sums (numerator and denominator), 4 FLOPs per term.
    A token's terms: the tokens before it, its own bonus term and the carried state's. Parallel
    ``N (N + 1)`` terms (every token against every column and the state); chunk ``L (L + 1)``
    in each chunk plus each token's term in its chunk's own state; recurrent 2 terms per token
    to read (the state and the bonus) and 2 to update the state."""
    check_form(form)
    if form == "parallel":
        return 4 * length * (length + 1) * channels
    if form == "recurrent":
        return 4 * 4 * length * channels
    return over_chunks(length, chunk_size, lambda size: 4 * (size * (size + 1) + size) * channels)
