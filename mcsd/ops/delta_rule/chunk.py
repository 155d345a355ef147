"""Chunkwise and parallel forms of the gated delta rule: the UT transform the papers use
(DeltaNet, Yang et al. 2024; Gated DeltaNet, 2025), here solved as a triangular system.

Inside a chunk of L tokens starting from the state ``S_0``, with ``G_t`` the cumulative
log-decay up to and including token t (``gamma_t = exp(G_t)``), the values each token writes,
``u_t = beta_t (v_t - k_t^T gamma_t S_0 - sum_{s<t} exp(G_t - G_s) (k_t . k_s) u_s)``, are one
unit lower-triangular system ``(I + diag(beta) A) U = diag(beta) (V - diag(gamma) K S_0)`` with
``A[t, s] = exp(G_t - G_s) (k_t . k_s)`` for ``s < t``: so ``U = U_0 - W S_0``, where ``U_0`` and
``W`` solve it for ``V`` and ``diag(gamma) K`` (no dependence on the state: every chunk at once).
Then ``O = diag(gamma) Q S_0 + (Q K^T * exp(G_t - G_s), s <= t) U`` and the state at the chunk's
end ``S_L = gamma_L S_0 + (K * exp(G_L - G_s))^T U``. The decays between positions are masked
sums (:func:`~mcsd.ops.common.segment_log_decays`), never differences of two cumulative sums.

The chunks are carried one after another (``S_0`` enters ``U`` through ``W``: the carry is
affine in the state, with a ``[Dk, Dk]`` map per chunk, which no sum over chunks can replace): a
loop over the chunks inside one op, ``mcsd::delta_rule_carry``, with its backward written out, so
that a graph traced with a symbolic length (dynamo's dynamic shapes) holds one node, not a loop
that would specialise on the number of chunks. The parallel form is the same system over the
whole sequence as one chunk (O(N^2) memory, O(N^3) for the solve: the reference for tests, as
fla keeps its own, and what an ONNX prefill runs); a system of symbolic size (``torch.export``'s
for ONNX, which has no triangular solve) is solved by forward substitution, row by row in a
``scan`` traced once for every size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch._higher_order_ops import scan
from torch.utils.flop_counter import register_flop_formula

from mcsd.ops.common import in_state_dtype, segment_log_decays, state_dtype


def chunk_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~mcsd.ops.delta_rule.recurrent.recurrent_delta_rule`, in chunks of
    ``chunk_size`` (the last one zero-padded: a padded token has ``beta = 0`` and decays nothing,
    so it writes and forgets nothing)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    return _delta_rule_in_chunks(q, k, v, beta, log_decay, initial_state, chunk_size, starts)


def parallel_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence as one chunk: one triangular system over every position."""
    return _delta_rule_in_chunks(q, k, v, beta, log_decay, initial_state, None, starts)


def _delta_rule_in_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None, chunk_size: int | None, starts: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both forms: chunks of ``chunk_size``, or with ``None`` one chunk of the whole sequence."""
    batch, heads, length, key_width = q.shape
    value_width = v.shape[-1]
    accumulate = state_dtype(v)
    num_chunks = 1 if chunk_size is None else -(-length // chunk_size)
    chunk_length = chunk_size or (length if isinstance(length, torch.SymInt) else max(length, 1))
    padding = num_chunks * chunk_length - length
    if starts is not None:
        log_decay = log_decay.masked_fill(starts[:, None, :], float("-inf"))

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [B, H, N, D] -> [B, H, nc, L, D], in the state's dtype
        return F.pad(x.to(accumulate), (0, 0, 0, padding)).view(batch, heads, num_chunks, chunk_length, x.shape[-1])

    with in_state_dtype(q.device):  # the system is solved in fp32 under autocast too
        q_chunks, k_chunks, v_chunks = chunked(q), chunked(k), chunked(v)
        beta_chunks, g = (chunked(x[..., None])[..., 0] for x in (beta, log_decay))  # [B, H, nc, L]
        decay = torch.exp(segment_log_decays(g))  # exp(G_t - G_s) for s <= t, 0 above
        system = (torch.matmul(k_chunks, k_chunks.transpose(-1, -2)) * decay).tril(-1)  # A, s < t
        gamma = torch.exp(g.cumsum(-1))[..., None]  # gamma_t
        right = beta_chunks[..., None] * torch.cat([v_chunks, gamma * k_chunks], dim=-1)
        solved = unit_lower_solve(system * beta_chunks[..., None], right)
        written, through_state = solved.split([value_width, key_width], dim=-1)  # U_0, W
        pieces = (written, through_state, gamma * q_chunks,  # gamma_t q_t: what reads S_0
                  torch.matmul(q_chunks, k_chunks.transpose(-1, -2)) * decay,  # s <= t
                  k_chunks * decay[..., -1, :, None],  # k_s exp(G_L - G_s)
                  gamma[..., -1, 0])  # gamma_L
        state = (torch.zeros(batch, heads, key_width, value_width, device=q.device, dtype=accumulate)
                 if initial_state is None else initial_state.to(accumulate))
        if chunk_size is None:  # one chunk, through autograd
            state, output = _chunk_step(state, _chunk(pieces, 0))
            output = output[:, :, None]
        else:
            output, state, _ = _carry(*pieces, state)
    output = output.reshape(batch, heads, num_chunks * chunk_length, value_width)[:, :, :length]
    return output.to(v.dtype), state


def _chunk_step(state: torch.Tensor, pieces: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk from its state ``S_0`` ``[B, H, Dk, Dv]``: (the state at its end, its output ``[B, H, L, Dv]``)."""
    written, through_state, from_state, scores, to_end, gamma_end = pieces
    values = written - torch.matmul(through_state, state)  # U
    output = torch.matmul(from_state, state) + torch.matmul(scores, values)
    state = gamma_end[..., None, None] * state + torch.matmul(to_end.transpose(-1, -2), values)
    return state, output


def _chunk(pieces: tuple[torch.Tensor, ...], chunk: int) -> tuple[torch.Tensor, ...]:
    return tuple(piece[:, :, chunk] for piece in pieces)


@torch.library.custom_op("mcsd::delta_rule_carry", mutates_args=())
def _carry(
    written: torch.Tensor, through_state: torch.Tensor, from_state: torch.Tensor, scores: torch.Tensor,
    to_end: torch.Tensor, gamma_end: torch.Tensor, state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunk after chunk from ``state`` (the pieces ``[B, H, nc, ...]``, ``nc >= 1``): every
    chunk's output ``[B, H, nc, L, Dv]``, the last state, and the state entering each chunk
    ``[B, H, nc, Dk, Dv]`` (for the backward). One op to dynamo: its loop over the chunks is no
    graph's, so nothing traced specialises on their number."""
    pieces = (written, through_state, from_state, scores, to_end, gamma_end)
    outputs, entering = [], []
    for chunk in range(written.shape[2]):
        entering.append(state)
        state, output = _chunk_step(state, _chunk(pieces, chunk))
        outputs.append(output)
    return torch.stack(outputs, dim=2), state, torch.stack(entering, dim=2)


@_carry.register_fake
def _(written, through_state, from_state, scores, to_end, gamma_end, state):
    entering = state.new_empty(*state.shape[:2], written.shape[2], *state.shape[2:])
    return written.new_empty(written.shape), state.new_empty(state.shape), entering


@torch.library.custom_op("mcsd::delta_rule_carry_backward", mutates_args=())
def _carry_backward(
    grad_output: torch.Tensor, grad_final: torch.Tensor, written: torch.Tensor, through_state: torch.Tensor,
    from_state: torch.Tensor, scores: torch.Tensor, to_end: torch.Tensor, gamma_end: torch.Tensor,
    entering: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The carry's gradients, last chunk first: with ``U = U_0 - W S``, ``O = Q' S + P U`` and
    ``S' = gamma S + K'^T U``, ``dU = P^T dO + K' dS'``, ``dS = Q'^T dO + gamma dS' - W^T dU``,
    ``dW = -dU S^T``, ``dQ' = dO S^T``, ``dP = dO U^T``, ``dK' = U dS'^T``, ``dgamma = <S, dS'>``."""
    pieces = (written, through_state, from_state, scores, to_end, gamma_end)
    grads: list[tuple[torch.Tensor, ...]] = []
    grad_state = grad_final
    for chunk in reversed(range(written.shape[2])):
        written_c, through_c, from_c, scores_c, to_end_c, gamma_c = _chunk(pieces, chunk)
        state, grad_out = entering[:, :, chunk], grad_output[:, :, chunk]
        values = written_c - torch.matmul(through_c, state)
        grad_values = torch.matmul(scores_c.transpose(-1, -2), grad_out) + torch.matmul(to_end_c, grad_state)
        grads.append((grad_values, -torch.matmul(grad_values, state.transpose(-1, -2)),
                      torch.matmul(grad_out, state.transpose(-1, -2)), torch.matmul(grad_out, values.transpose(-1, -2)),
                      torch.matmul(values, grad_state.transpose(-1, -2)), (state * grad_state).sum((-1, -2))))
        grad_state = (torch.matmul(from_c.transpose(-1, -2), grad_out) + gamma_c[..., None, None] * grad_state
                      - torch.matmul(through_c.transpose(-1, -2), grad_values))
    return (*(torch.stack(grad[::-1], dim=2) for grad in zip(*grads)), grad_state)


@_carry_backward.register_fake
def _(grad_output, grad_final, written, through_state, from_state, scores, to_end, gamma_end, entering):
    return (*(piece.new_empty(piece.shape) for piece in (written, through_state, from_state, scores, to_end,
                                                         gamma_end)), grad_final.new_empty(grad_final.shape))


@register_flop_formula(torch.ops.mcsd.delta_rule_carry)
def _carry_flops(written: torch.Size, through_state: torch.Size, *_: torch.Size, **__: object) -> int:
    """What ``FlopCounterMode`` counts for the carry (an op it cannot see into): per chunk and
    head the products ``W S``, ``Q' S``, ``K'^T U`` (``2 L dk dv`` each) and ``P U`` (``2 L^2 dv``)."""
    *rows, length, value_width = written
    return math.prod(rows) * (6 * length * through_state[-1] * value_width + 2 * length * length * value_width)


@register_flop_formula(torch.ops.mcsd.delta_rule_carry_backward)
def _carry_backward_flops(_grad_output: torch.Size, _grad_final: torch.Size, written: torch.Size,
                          through_state: torch.Size, *_: torch.Size, **__: object) -> int:
    """The backward's products: ``W S`` (``U`` again), ``K' dS'``, ``Q'^T dO``, ``W^T dU``, ``dW``,
    ``dQ'``, ``dK'`` (``2 L dk dv`` each), ``P^T dO`` and ``dP`` (``2 L^2 dv`` each)."""
    *rows, length, value_width = written
    return math.prod(rows) * (14 * length * through_state[-1] * value_width + 4 * length * length * value_width)


def _save_for_backward(ctx, inputs: tuple[torch.Tensor, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.save_for_backward(*inputs[:-1], output[2])


def _backward(ctx, grad_output: torch.Tensor, grad_final: torch.Tensor, _grad_entering: torch.Tensor):
    return _carry_backward(grad_output, grad_final, *ctx.saved_tensors)


_carry.register_autograd(_backward, setup_context=_save_for_backward)


def unit_lower_solve(strictly_lower: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``X`` with ``(I + strictly_lower) X = right`` (``[..., n, n]`` below its diagonal, ``[..., n, d]``):
    ``torch.linalg.solve_triangular`` for a concrete ``n``; forward substitution, one row at a time
    in a ``scan``, for a symbolic one (what ONNX, which has no triangular solve, can take)."""
    size = strictly_lower.shape[-1]
    if not isinstance(size, torch.SymInt):
        identity = torch.eye(size, dtype=right.dtype, device=right.device)
        return torch.linalg.solve_triangular(strictly_lower + identity, right, upper=False, unitriangular=True)
    rows = torch.eye(size, dtype=right.dtype, device=right.device)  # row t of X is filled at step t
    _, solved = scan(_substitute_row, torch.zeros_like(right),
                     (strictly_lower.movedim(-2, 0), right.movedim(-2, 0), rows))
    return solved.movedim(0, -2)


def _substitute_row(
    solved: torch.Tensor, row: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row t: ``x_t = r_t - sum_{s<t} T[t, s] x_s`` from the rows solved so far (zeros from t on)."""
    coefficients, target, where = row  # [..., n], [..., d], [n] one-hot at t
    value = target - torch.matmul(coefficients[..., None, :], solved)[..., 0, :]
    return solved + where[:, None] * value[..., None, :], value
