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
affine in the state, with a ``[Dk, Dk]`` map per chunk), a Python loop over chunks of small
products. The parallel form is the same system over the whole sequence as one chunk (O(N^2)
memory, O(N^3) for the solve: the reference for tests, as fla keeps its own).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    batch, heads, length, key_width = q.shape
    value_width = v.shape[-1]
    accumulate = state_dtype(v)
    num_chunks = -(-length // chunk_size)
    padding = num_chunks * chunk_size - length
    if starts is not None:
        log_decay = log_decay.masked_fill(starts[:, None, :], float("-inf"))

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [B, H, N, D] -> [B, H, nc, L, D], in the state's dtype
        return F.pad(x.to(accumulate), (0, 0, 0, padding)).view(batch, heads, num_chunks, chunk_size, x.shape[-1])

    with in_state_dtype(q.device):  # the system is solved in fp32 under autocast too
        q_chunks, k_chunks, v_chunks = chunked(q), chunked(k), chunked(v)
        beta_chunks, g = (chunked(x[..., None])[..., 0] for x in (beta, log_decay))  # [B, H, nc, L]
        within = g.cumsum(-1)  # G_t
        decay = torch.exp(segment_log_decays(g))  # exp(G_t - G_s) for s <= t, 0 above
        lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril(-1)
        system = torch.matmul(k_chunks, k_chunks.transpose(-1, -2)) * decay * lower  # A, s < t
        system = system * beta_chunks[..., None] + torch.eye(chunk_size, dtype=accumulate, device=q.device)
        gamma = torch.exp(within)[..., None]
        right = beta_chunks[..., None] * torch.cat([v_chunks, gamma * k_chunks], dim=-1)
        solved = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
        written, through_state = solved.split([value_width, key_width], dim=-1)  # U_0, W
        scores = torch.matmul(q_chunks, k_chunks.transpose(-1, -2)) * decay  # s <= t
        from_state = gamma * q_chunks  # gamma_t q_t: what reads S_0
        to_end = k_chunks * decay[..., -1, :, None]  # k_s exp(G_L - G_s)
        state = (torch.zeros(batch, heads, key_width, value_width, device=q.device, dtype=accumulate)
                 if initial_state is None else initial_state.to(accumulate))
        outputs = []
        for chunk in range(num_chunks):
            values = written[:, :, chunk] - torch.matmul(through_state[:, :, chunk], state)  # U
            outputs.append(torch.matmul(from_state[:, :, chunk], state) + torch.matmul(scores[:, :, chunk], values))
            state = (gamma[:, :, chunk, -1, :, None] * state
                     + torch.matmul(to_end[:, :, chunk].transpose(-1, -2), values))
    output = torch.stack(outputs, dim=2).view(batch, heads, num_chunks * chunk_size, value_width)[:, :, :length]
    return output.to(v.dtype), state


def parallel_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence as one chunk: one triangular system over every position."""
    return chunk_delta_rule(q, k, v, beta, log_decay, initial_state, max(q.shape[2], 1), starts)
