"""torchscale's multi-scale retention inside the harness: an independent RetNet layer to train beside ours.

``model.implementation=torchscale`` builds each RetNet layer's mixer from Microsoft's own code,
``torchscale.component.multiscale_retention.MultiScaleRetention`` (torchscale 0.3.0, the RetNet
authors' library): its projections, its initialisation (Xavier-uniform, gain ``2^-2.5`` for q, k, v
and the gate), its normalisations (decay rows scaled by ``1/sqrt(row sum)``, scores by their clamped
row sum, the recurrent state by ``sqrt`` of its running scale), its per-head RMSNorm without a gain,
its swish gate and its three forms. What this module adds is what torchscale's ``RetNetRelPos``
computes (its ``architecture`` module imports fairscale and timm, whose pins would move torch's,
so it is not imported): the rotation angles ``1 / base^linspace(0, 1, dk/2)`` and the decay masks of
each form, from the decays ``gamma_h = 1 - 2^(-decay_offset-h)``; and the state a sequence form
leaves, which torchscale's parallel and chunkwise forms do not return.

Install: ``pip install --no-deps torchscale==0.3.0`` (its declared dependencies, fairscale and timm,
are not used by this layer). Its arithmetic runs in the model's dtype, its state too.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from mcsd.models.config import ConfigError
from mcsd.models.modules.decays import section_log_decay
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.retnet.configuration_retnet import RetNetConfig
from mcsd.ops.context import ForwardContext
from mcsd.ops.flops import decayed_attention_flops

INSTALL = "pip install --no-deps torchscale==0.3.0"


@functools.cache
def torchscale_retention_class() -> type:
    """torchscale's ``MultiScaleRetention``, its sequence forms keeping the rotated keys and the
    values they were given (the state a sequence form leaves is computed from them); or one line
    naming the install."""
    try:
        from torchscale.component.multiscale_retention import MultiScaleRetention
    except ImportError:
        raise ConfigError(f"model.implementation=torchscale needs torchscale: {INSTALL} (or "
                          "model.implementation=mcsd, this project's layer)") from None

    class KeepingKeysValues(MultiScaleRetention):
        retained: tuple[torch.Tensor, torch.Tensor] | None = None

        def parallel_forward(self, qr, kr, v, mask):
            self.retained = (kr, v)
            return super().parallel_forward(qr, kr, v, mask)

        def chunk_recurrent_forward(self, qr, kr, v, inner_mask):
            self.retained = (kr, v)
            return super().chunk_recurrent_forward(qr, kr, v, inner_mask)

    return KeepingKeysValues


class TorchscaleRetention(TokenMixer):
    """RetNet's mixer as torchscale writes it, behind this project's mixer interface.

    Forms: ``parallel`` and ``chunk`` (torchscale's ``parallel_forward`` and
    ``chunk_recurrent_forward``) start a sequence; ``recurrent`` (its ``recurrent_forward``, one
    token at a time) continues any state. The state is torchscale's ``prev_key_value``, ``[B, H,
    dv, dk]``; its running scale is a function of the position and is recomputed from it.
    Its weights keep torchscale's initialisation (no residual weight is redrawn by the skeleton)."""

    def __init__(self, config: RetNetConfig) -> None:
        super().__init__()
        self.num_heads = config.num_channels
        self.key_width = config.channel_width
        self.value_width = config.value_expansion * config.channel_width
        self.rope_base = config.rope_base if config.rope else None
        self.decay_offset = config.decay_offset
        arguments = types.SimpleNamespace(multiway=False, layernorm_eps=config.norm_eps)
        self.layer = torchscale_retention_class()(arguments, config.hidden_size, self.num_heads * self.value_width,
                                                   self.num_heads)

    def reset_parameters(self) -> None:
        self.layer.reset_parameters()

    def log_decay(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``log gamma_h`` per head, ``[H]``, in ``dtype`` (fp32, or fp64 in an fp64 model)."""
        return section_log_decay("decay", self.num_heads, device, dtype, self.decay_offset)

    def rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sin, cos)`` ``[..., dk]`` at ``positions`` (RetNetRelPos' angles, each pair's twice),
        computed in fp32 (fp64 in an fp64 model), handed over in ``dtype``; with ``rope: false``
        sin 0 and cos 1, which torchscale's rotation leaves unchanged."""
        shape = (*positions.shape, self.key_width)
        if self.rope_base is None:
            return positions.new_zeros(shape, dtype=dtype), positions.new_ones(shape, dtype=dtype)
        compute = torch.promote_types(dtype, torch.float32)
        exponents = torch.linspace(0, 1, self.key_width // 2, device=positions.device, dtype=compute)
        angle = (1.0 / self.rope_base ** exponents).repeat_interleave(2)
        phase = positions.to(compute)[..., None] * angle
        return phase.sin().to(dtype), phase.cos().to(dtype)

    def decay_mask(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``gamma_h^(n-m)`` for ``m <= n``, else 0: ``[H, N, N]`` in ``dtype``."""
        index = torch.arange(length, device=device, dtype=dtype)
        distance = index[:, None] - index[None, :]
        decayed = (distance.clamp(min=0) * self.log_decay(device, dtype)[:, None, None]).exp()
        return torch.where(distance >= 0, decayed, 0.0)

    def sequence_positions(self, length: int, chunk_size: int | None, device: torch.device, dtype: torch.dtype):
        """What ``RetNetRelPos`` hands torchscale's parallel form (``chunk_size`` ``None``) or its
        chunkwise form of ``chunk_size`` for ``length`` tokens (computed in fp32, or fp64 in an
        fp64 model; handed over in ``dtype``)."""
        rotation = self.rotation(torch.arange(length, device=device), dtype)
        compute = torch.promote_types(dtype, torch.float32)
        if chunk_size is None:
            mask = self.decay_mask(length, device, compute)
            return rotation, (mask / mask.sum(-1, keepdim=True).sqrt()).to(dtype)
        size, log_decay = chunk_size, self.log_decay(device, compute)
        mask = self.decay_mask(size, device, compute)
        last_row = mask[:, -1]  # gamma^(C-1-m): how each key of a chunk reaches its end
        scale = mask.sum(-1, keepdim=True).sqrt()
        value_inner = (last_row / last_row.sum(-1, keepdim=True))[..., None]
        cross = (log_decay * size).exp()[:, None, None]
        steps = torch.arange(1, size + 1, device=device, dtype=compute)
        query_inner = (log_decay[:, None] * steps).exp()[..., None] / (scale / last_row.sum(-1)[:, None, None])
        return rotation, tuple(part.to(dtype) for part in (mask / scale, cross, query_inner, value_inner))

    def running_scale(self, position: int | torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """torchscale's recurrent ``scale`` after ``position`` tokens, ``sum_{i<position} gamma_h^i``,
        ``[H]``, computed in fp32 (fp64 in an fp64 model), handed over in ``dtype``."""
        decay = self.log_decay(device, torch.promote_types(dtype, torch.float32)).exp()
        return ((1 - decay ** position) / (1 - decay)).to(dtype)

    separates_documents = False  # torchscale's forms know one sequence

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        form = context.form
        if form == "recurrent":
            outputs = []
            for offset in range(x.shape[1]):
                out, state = self.step(x[:, offset], state, position + offset, context)
                outputs.append(out)
            return torch.stack(outputs, 1), state
        if state is not None or position:
            raise ConfigError(f"form={form} of model.implementation=torchscale starts a sequence (torchscale's "
                              "parallel and chunkwise forms take no state): continue one with form=recurrent")
        length = x.shape[1]
        chunk_size = context.chunk_size if form == "chunk" else None
        padded = -length % chunk_size if chunk_size else 0  # zero tokens at the end change no earlier one
        x = F.pad(x, (0, 0, 0, padded))
        positions = self.sequence_positions(x.shape[1], chunk_size, x.device, x.dtype)
        out = self.layer(x, positions, chunkwise_recurrent=form == "chunk")[:, :length]
        keys, values = self.layer.retained
        self.layer.retained = None
        return out, self.sequence_state(keys[:, :, :length], values[:, :length], x.device)

    def sequence_state(self, keys: torch.Tensor, values: torch.Tensor, device: torch.device) -> torch.Tensor:
        """torchscale's recurrent state after these ``N`` tokens: ``sum_m gamma^(N-1-m) v_m k_m^T``
        over ``sqrt`` of the running scale (``keys`` rotated ``[B, H, N, dk]``, ``values`` ``[B, N, H*dv]``)."""
        length = keys.shape[2]
        weights = self.decay_mask(length, device, torch.promote_types(keys.dtype, torch.float32))[:, -1]  # [H, N]
        values = values.view(*values.shape[:2], self.num_heads, self.value_width)
        state = torch.einsum("hn,bnhv,bhnk->bhvk", weights.to(keys.dtype), values, keys)
        return state / self.running_scale(length, device, state.dtype).sqrt()[:, None, None]

    def step(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = {}
        if state is not None:
            cache = {"prev_key_value": state, "scale": self.running_scale(position, x.device, state.dtype)}
        position = torch.as_tensor(position, device=x.device)
        decay = self.log_decay(x.device, torch.promote_types(x.dtype, torch.float32)).exp().to(x.dtype)
        out = self.layer(x[:, None], (self.rotation(position, x.dtype), decay), incremental_state=cache)
        return out[:, 0], cache["prev_key_value"]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        return self.num_heads * decayed_attention_flops(length, self.key_width, self.value_width, context.form,
                                                        context.chunk_size)
