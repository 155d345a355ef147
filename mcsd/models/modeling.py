"""The skeleton every architecture shares (Section 2.1); decoding on top of it is
:mod:`mcsd.models.decoding` (a mixin of :class:`CausalLM`).

``h = x + Mixer(RMSNorm(x)); out = h + MLP(RMSNorm(h))``, with token embedding in, final
RMSNorm and LM head out. Each layer's mixer (a :class:`TokenMixer`) and MLP come from the
architecture's model class (:meth:`CausalLM.make_mixer`, :meth:`CausalLM.make_mlp`), given the
config and the layer index, so a hybrid can choose per layer; an MLP
that carries a decoding state of its own (RWKV-4's channel mixer and its token shift) is a
:class:`TokenMixer` too. Every module initialises itself (``reset_parameters``); the
skeleton only scales the projections that write into the residual stream.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mcsd.models.config import ConfigError, LMConfig, check_kernels
from mcsd.models.decoding import DecodingMixin
from mcsd.models.modules.compiled import compiled_method
from mcsd.models.modules.layers import GatedMLP, OneStream, weight_flops_per_token
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.state import DecodingState, LayerState
from mcsd.ops.context import ForwardContext

if TYPE_CHECKING:
    from mcsd.models.registry import Architecture



class InitStep(NamedTuple):
    """One step of a model's initialisation: ``initialise(module)`` draws the values of the
    submodule at ``path`` and returns the parameters it wrote."""

    path: str
    initialise: Callable[[nn.Module], list[nn.Parameter]]


class Layer(nn.Module):
    """One pre-RMSNorm residual layer of layer index ``layer_index``: its ``mixer`` and its
    ``mlp`` (``None``: no MLP, and no norm before it; zoology's MQAR models are their mixers
    alone, ``mlp_hidden_size=0``)."""

    def __init__(self, config: LMConfig, layer_index: int, mixer: TokenMixer, mlp: nn.Module | None) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.mixer_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mixer = mixer
        self.mlp_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps) if mlp is not None else None
        self.mlp = mlp
        self.mlp_has_state = isinstance(self.mlp, TokenMixer)
        self.activation_checkpointing = config.activation_checkpointing
        # what recomputes it (transformers' activation_checkpointing_enable passes its own: offload, kwargs)
        self.checkpoint_function: Callable = functools.partial(checkpoint, use_reentrant=False)

    @property
    def state_rewinds(self) -> bool:
        """Whether every state of the layer keeps an entry per position (:attr:`TokenMixer.state_rewinds`)."""
        return self.mixer.state_rewinds and (not self.mlp_has_state or self.mlp.state_rewinds)

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> LayerState:
        mlp = self.mlp.init_state(batch_size, capacity, device, dtype) if self.mlp_has_state else None
        return LayerState(self.mixer.init_state(batch_size, capacity, device, dtype), mlp)

    def last_document(self, layer_state: LayerState, length: int | torch.Tensor) -> LayerState:
        """The layer's state after a packed run, for decoding its last document (of ``length``
        tokens, or ``[B]``: each row's) on (:meth:`TokenMixer.last_document`)."""
        mlp = self.mlp.last_document(layer_state.mlp, length) if self.mlp_has_state else layer_state.mlp
        return LayerState(self.mixer.last_document(layer_state.mixer, length), mlp)

    def reset_parameters(self) -> None:
        for module in (self.mixer_norm, self.mixer, self.mlp_norm, self.mlp):
            if module is not None:
                module.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [*(self.mlp.residual_weights() if self.mlp is not None else []), *self.mixer.residual_weights()]

    @property
    def separates_documents(self) -> bool:
        """Whether the layer's mixer (and a stateful MLP) keep documents apart (``position_ids``)."""
        return self.mixer.separates_documents and (not self.mlp_has_state or self.mlp.separates_documents)

    def forward(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, LayerState]:
        """The layer over ``x`` ``[B, N, D]`` in the call's ``context`` (:class:`ForwardContext`).
        With ``activation_checkpointing``, a pass that builds a graph from a fresh state (training)
        keeps only the layer's input and computes its activations again in the backward."""
        if self.activation_checkpointing and layer_state is None and torch.is_grad_enabled():
            return self.checkpoint_function(self._forward, x, layer_state, position, context)
        return self._forward(x, layer_state, position, context)

    def _forward(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, LayerState]:
        mixer_state, mlp_state = layer_state if layer_state is not None else (None, None)
        mixed, mixer_state = self.mixer(self.mixer_norm(x), mixer_state, position, context)
        h = x + mixed
        if self.mlp is None:
            return h, LayerState(mixer_state, None)
        if self.mlp_has_state:
            out, mlp_state = self.mlp(self.mlp_norm(h), mlp_state, position, context)
        else:
            out = self.mlp(self.mlp_norm(h))
        return h + out, LayerState(mixer_state, mlp_state)

    def step(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, LayerState]:
        """:meth:`forward` for one token per row, ``x`` ``[B, D]``, through the mixers' steps
        (``context``: a step's, :meth:`ForwardContext.step`)."""
        mixer_state, mlp_state = layer_state if layer_state is not None else (None, None)
        mixed, mixer_state = self.mixer.step(self.mixer_norm(x), mixer_state, position, context)
        h = x + mixed
        if self.mlp is None:
            return h, LayerState(mixer_state, None)
        if self.mlp_has_state:
            out, mlp_state = self.mlp.step(self.mlp_norm(h), mlp_state, position, context)
        else:
            out = self.mlp(self.mlp_norm(h))
        return h + out, LayerState(mixer_state, mlp_state)


class CausalLM(DecodingMixin, nn.Module):
    """A decoder-only language model over a :class:`TokenMixer`, with decoding helpers
    (:class:`~mcsd.models.decoding.DecodingMixin`).

    - ``model(input_ids)`` -> logits ``[B, N, vocab]`` (``form`` picks the mixer's form);
    - ``model.prefill(input_ids)`` -> (last position's logits ``[B, vocab]``, state);
    - ``model.step(token_ids, state)`` -> (logits ``[B, vocab]``, state);
    - ``model.generate`` / ``model.stream``: greedy or sampled decoding on top.

    ``architecture`` (set by :func:`mcsd.models.registry.register`) names the forms the
    model has and the one that training and scoring use.
    """

    architecture: ClassVar[Architecture]

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        built = {name: build() for name, build in self.parts(config)}
        self.embed = built["embed"]
        self.layers = nn.ModuleList(built[f"layers.{index}"] for index in range(config.num_layers))
        self.final_norm, self.streams, self.lm_head = built["final_norm"], built["streams"], built["lm_head"]
        self.tie_weights()
        self.reset_parameters()

    def tie_weights(self) -> None:
        """With ``tie_embeddings``, the LM head's weight is the embedding's (one parameter)."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @classmethod
    def make_mixer(cls, config: LMConfig, layer_index: int) -> TokenMixer:
        """The token mixer of layer ``layer_index`` (a hybrid chooses per layer): each
        architecture's model class builds its own."""
        raise NotImplementedError(f"{cls.__qualname__} must define make_mixer")

    @classmethod
    def make_mlp(cls, config: LMConfig, layer_index: int) -> nn.Module:
        """The MLP of layer ``layer_index``: GeGLU unless the architecture has its own (one with a
        decoding state of its own is a :class:`TokenMixer`)."""
        return GatedMLP(config.hidden_size, config.mlp_hidden_size, config.init_std)

    @classmethod
    def make_streams(cls, config: LMConfig) -> nn.Module:
        """The residual streams of the model (one, unless the architecture runs several: RWKV-4's
        perspectives); see :class:`mcsd.models.modules.layers.OneStream`."""
        return OneStream()

    @classmethod
    def make_layer(cls, config: LMConfig, layer_index: int) -> Layer:
        """Layer ``layer_index``: its mixer, and its MLP unless ``mlp_hidden_size=0``."""
        mixer = cls.make_mixer(config, layer_index)
        mlp = cls.make_mlp(config, layer_index) if config.mlp_hidden_size > 0 else None
        return Layer(config, layer_index, mixer, mlp)

    @classmethod
    def parts(cls, config: LMConfig) -> list[tuple[str, Callable[[], nn.Module]]]:
        """The model's top-level modules by name, each with its constructor, in the order they
        are built (:func:`mcsd.build_model` builds them on the meta device: their constructors'
        own initialisation draws nothing, :meth:`reset_parameters` draws every value)."""
        return [("embed", functools.partial(nn.Embedding, config.vocab_size, config.hidden_size)),
                *((f"layers.{index}", functools.partial(cls.make_layer, config, index))
                  for index in range(config.num_layers)),
                ("final_norm", functools.partial(nn.RMSNorm, config.hidden_size, eps=config.norm_eps)),
                ("streams", functools.partial(cls.make_streams, config)),
                ("lm_head", functools.partial(nn.Linear, config.hidden_size, config.vocab_size, bias=False))]

    def use_kernels(self, kernels: str) -> None:
        """Run the mixers' chunk and recurrent forms through ``kernels`` (``model.kernels``:
        :mod:`mcsd.ops.kernels`) from now on: the config says so, and each call's
        :meth:`context` hands it to the ops. What the model computes does not change."""
        check_kernels(kernels)
        self.config = dataclasses.replace(self.config, kernels=kernels)

    def context(self, form: str, position_ids: torch.Tensor | None = None) -> ForwardContext:
        """The :class:`ForwardContext` of one call in ``form``: the config's kernels and chunk
        size, the documents of ``position_ids`` (``None``: none apart)."""
        return ForwardContext.of(form, self.config.kernels, self.config.chunk_size, position_ids)

    def step_context(self) -> ForwardContext:
        """The :class:`ForwardContext` of a decoding step: the recurrent form, the config's kernels."""
        return ForwardContext.step(self.config.kernels, self.config.chunk_size)

    @property
    def default_form(self) -> str:
        """The form ``forward`` uses unless told otherwise: the architecture's training form."""
        return self.architecture.train_form

    def init_steps(self) -> list[InitStep]:
        """The initialisation, step by step: Normal(0, init_std) embedding and LM head, unit norm
        gains, each layer's modules as they initialise themselves, the weights of the layer that
        write into the residual stream (drawn at init_std by their modules) then scaled to
        std / sqrt(2 L). Every value is drawn once."""
        std = self.config.init_std
        residual_scale = 1 / math.sqrt(2 * self.config.num_layers)

        def normal(module: nn.Module) -> list[nn.Parameter]:
            nn.init.normal_(module.weight, std=std)
            return [module.weight]

        def reset(module: nn.Module) -> list[nn.Parameter]:
            module.reset_parameters()
            return list(module.parameters())

        def layer_reset(layer: nn.Module) -> list[nn.Parameter]:
            layer.reset_parameters()
            for weight in layer.residual_weights():
                weight.mul_(residual_scale)
            return list(layer.parameters())

        layers = [f"layers.{index}" for index in range(self.config.num_layers)]
        return [InitStep("embed", normal), *(InitStep(path, layer_reset) for path in layers),
                InitStep("final_norm", reset), InitStep("streams", reset), InitStep("lm_head", normal)]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter (:meth:`init_steps`, in order)."""
        for step in self.init_steps():
            step.initialise(self.get_submodule(step.path))

    def activated_parameters(self) -> int:
        """Parameters one token's forward pass reads: all of them, less what modules with sparse
        experts leave unread (``inactive_parameters_per_token``: CDMoE's unselected experts)."""
        total = sum(parameter.numel() for parameter in self.parameters())
        return total - sum(module.inactive_parameters_per_token() for module in self.modules()
                           if hasattr(module, "inactive_parameters_per_token"))

    def forward_flops(self, batch: int, length: int, form: str | None = None, scored: int | None = None) -> int:
        """The model FLOPs of a forward pass over ``batch`` rows of ``length`` tokens in ``form``
        (the training form by default): each layer's weights (:func:`weight_flops_per_token`) and
        its mixers' sums over positions (:meth:`TokenMixer.sequence_flops`) for every stream of
        every row, the streams' merge weights and the LM head at ``scored`` positions (every
        position by default; MQAR's loss reads a few). The embedding is a lookup: no FLOPs."""
        weights, sequence = self._flops(batch, length, form or self.default_form, scored, backward=False)
        return weights + sequence

    def training_flops(self, batch: int, length: int, form: str | None = None, scored: int | None = None) -> int:
        """The model FLOPs of a training step: :meth:`forward_flops` and its backward, twice the
        forward's work for the weights (a gradient of the input and one of the weight, PaLM's
        appendix B: ``6 N`` per token, and ``12 L d N`` for attention) and each mixer's
        :attr:`TokenMixer.sequence_backward_factor` for its sums over positions. Activation
        checkpointing's recomputation is not model work and is not counted."""
        weights, sequence = self._flops(batch, length, form or self.default_form, scored, backward=True)
        return 3 * weights + sequence

    def _flops(self, batch: int, length: int, form: str, scored: int | None, backward: bool) -> tuple[int, int]:
        """(the weights' forward FLOPs, the sums over positions' forward or training FLOPs)."""
        tokens = batch * length
        mixers = [module for layer in self.layers
                  for module in (layer.mixer, layer.mlp if layer.mlp_has_state else None) if module is not None]
        context = self.context(form)
        sequence = sum(batch * mixer.sequence_flops(length, context)
                       * (1 + mixer.sequence_backward_factor if backward else 1) for mixer in mixers)
        layers = sum(weight_flops_per_token(layer) for layer in self.layers) * tokens
        head = weight_flops_per_token(self.lm_head) * (tokens if scored is None else scored)
        weights = self.streams.count * layers + weight_flops_per_token(self.streams) * tokens + head
        return weights, self.streams.count * sequence

    def init_state(self, batch_size: int, capacity: int = 0) -> DecodingState:
        """A fresh decoding state for ``batch_size`` rows and up to ``capacity`` tokens."""
        device, dtype = self.embed.weight.device, self.embed.weight.dtype
        layers = [layer.init_state(batch_size, capacity, device, dtype) for layer in self.layers]
        return DecodingState(position=0, layers=layers)

    @property
    def separates_documents(self) -> bool:
        """Whether every layer keeps the documents of a packed batch apart (``position_ids``)."""
        return all(layer.separates_documents for layer in self.layers)

    def documents_apart_problem(self) -> str | None:
        """Why this model cannot keep the documents of a packed batch apart, in one line with the
        fix (``None``: it can): what a forward with ``position_ids`` and ``mcsd-train
        data.documents=apart`` refuse."""
        if self.separates_documents:
            return None
        return (f"{self.architecture.name} cannot keep the documents of a packed batch apart yet: use "
                "data.documents=joined")

    def run(
        self, input_ids: torch.Tensor | None, state: DecodingState, form: str, position_ids: torch.Tensor | None = None,
        *, inputs_embeds: torch.Tensor | None = None, layer_inputs: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, DecodingState]:
        """Continue ``state`` with ``input_ids`` ``[B, N]`` in ``form``: the final-normed hidden states
        ``[B, N, D]`` of every position and the state after them. ``position_ids`` ``[B, N]`` (each
        token's position in its own document, 0 where one starts; Hugging Face's convention for a
        packed batch) keeps documents apart: the state after them is the last document's.
        ``inputs_embeds`` ``[B, N, D]``: vectors in place of ``input_ids``' embeddings (prompt tuning);
        ``layer_inputs``: a list that gets each layer's input ``[B, N, D]`` (the embeddings first;
        several streams merged as the LM head merges them)."""
        if form not in self.architecture.forms:
            raise ConfigError(f"form={form!r} is not a form of {self.architecture.name}: use one of "
                              f"{', '.join(self.architecture.forms)}")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("run() takes input_ids or inputs_embeds, one of them")
        if state.positions is not None:
            raise ValueError("a padded batch's state (its rows at different positions) goes on one token at a time: "
                             "step() it")
        if input_ids is not None and input_ids.dim() != 2:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: expected [batch, length]")
        embedded = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if inputs_embeds is not None and (inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size):
            raise ValueError(f"inputs_embeds has shape {tuple(inputs_embeds.shape)}: expected [batch, length, "
                             f"{self.config.hidden_size}]")
        if position_ids is not None:
            if (problem := self.documents_apart_problem()) is not None:
                raise ConfigError(problem)
            if position_ids.shape != embedded.shape[:2]:
                raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}: expected the tokens' "
                                 f"{tuple(embedded.shape[:2])}")
        x = self.streams.split(embedded)
        if position_ids is not None and self.streams.count > 1:  # every stream's rows alike (stream-major)
            position_ids = position_ids.repeat(self.streams.count, 1)
        context = self.context(form, position_ids)
        layers = []
        for layer, layer_state in zip(self.layers, state.layers):
            if layer_inputs is not None:
                layer_inputs.append(self.streams.merge(x))
            x, layer_state = layer(x, layer_state, state.position, context)
            layers.append(layer_state)
        hidden = self.streams.merge(self.final_norm(x))
        return hidden, DecodingState(position=state.position + embedded.shape[1], layers=layers)

    def forward(
        self, input_ids: torch.Tensor, form: str | None = None, positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, N, vocab]`` for every position (training and scoring), or ``[P, vocab]`` at
        ``positions`` alone (indices into the flattened ``[B * N]`` positions: the LM head reads
        only those, e.g. MQAR's answers). A forward call, so FSDP2 gathers the root's weights.
        ``position_ids``: documents apart in a packed batch (:meth:`run`)."""
        hidden = self.hidden_states(input_ids, form, position_ids)
        return self.lm_head(hidden if positions is None else hidden.flatten(0, 1)[positions])

    def loss(
        self, input_ids: torch.Tensor, targets: torch.Tensor, form: str | None = None,
        positions: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean next-token cross-entropy (fp32) of :meth:`forward`'s logits against ``targets``
        ``[B, N]`` (``-100``: not scored), and the logits: what a training step differentiates.
        With ``positions`` (indices into the flattened ``[B * N]`` positions, e.g. MQAR's answers),
        the LM head reads those positions alone and ``targets`` ``[P]`` are theirs.
        ``position_ids``: documents apart in a packed batch (:meth:`run`)."""
        logits = self(input_ids, form, positions, position_ids)
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten()), logits

    def loss_function(
        self, compile: bool = False
    ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`loss`, or with ``compile`` its ``torch.compile``d twin, kept for this model: the
        model and the cross-entropy in one graph, so that the softmax over the vocabulary fuses
        with the loss and its backward (``nn.Module.compile`` would compile the logits alone)."""
        if not compile:
            return self.loss
        return compiled_method(_COMPILED_LOSSES, self, "loss")

    def hidden_states(
        self, input_ids: torch.Tensor, form: str | None = None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final-normed hidden states ``[B, N, D]`` that the LM head reads (a loss on a few
        positions applies ``lm_head`` to those alone)."""
        fresh = DecodingState(position=0, layers=[None] * len(self.layers))
        hidden, _ = self.run(input_ids, fresh, form or self.default_form, position_ids)
        return hidden


_COMPILED_LOSSES: weakref.WeakKeyDictionary[CausalLM, Callable] = weakref.WeakKeyDictionary()
