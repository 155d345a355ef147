"""The skeleton every architecture shares (Section 2.1) and decoding on top of it.

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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from mcsd.models.config import ConfigError, LMConfig, check_kernels
from mcsd.models.modules.compiled import compiled_method
from mcsd.models.modules.layers import GatedMLP, OneStream, weight_flops_per_token
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.state import Decoding, DecodingState, LayerState, tensors_of
from mcsd.models.static_decoding import StaticStep

if TYPE_CHECKING:
    from mcsd.models.registry import Architecture


PREFILL_FORM = "chunk"  # the form a prompt is read in before decoding


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

    @property
    def state_rewinds(self) -> bool:
        """Whether every state of the layer keeps an entry per position (:attr:`TokenMixer.state_rewinds`)."""
        return self.mixer.state_rewinds and (not self.mlp_has_state or self.mlp.state_rewinds)

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> LayerState:
        mlp = self.mlp.init_state(batch_size, capacity, device, dtype) if self.mlp_has_state else None
        return LayerState(self.mixer.init_state(batch_size, capacity, device, dtype), mlp)

    def reset_parameters(self) -> None:
        for module in (self.mixer_norm, self.mixer, self.mlp_norm, self.mlp):
            if module is not None:
                module.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [*(self.mlp.residual_weights() if self.mlp is not None else []), *self.mixer.residual_weights()]

    def forward(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int, form: str
    ) -> tuple[torch.Tensor, LayerState]:
        """With ``activation_checkpointing``, a pass that builds a graph from a fresh state (training)
        keeps only the layer's input and computes its activations again in the backward."""
        if self.activation_checkpointing and layer_state is None and torch.is_grad_enabled():
            return checkpoint(self._forward, x, layer_state, position, form, use_reentrant=False)
        return self._forward(x, layer_state, position, form)

    def _forward(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int, form: str
    ) -> tuple[torch.Tensor, LayerState]:
        mixer_state, mlp_state = layer_state if layer_state is not None else (None, None)
        mixed, mixer_state = self.mixer(self.mixer_norm(x), mixer_state, position, form)
        h = x + mixed
        if self.mlp is None:
            return h, LayerState(mixer_state, None)
        if self.mlp_has_state:
            out, mlp_state = self.mlp(self.mlp_norm(h), mlp_state, position, form)
        else:
            out = self.mlp(self.mlp_norm(h))
        return h + out, LayerState(mixer_state, mlp_state)

    def step(
        self, x: torch.Tensor, layer_state: LayerState | None, position: int | torch.Tensor
    ) -> tuple[torch.Tensor, LayerState]:
        """:meth:`forward` for one token per row, ``x`` ``[B, D]``, through the mixers' steps."""
        mixer_state, mlp_state = layer_state if layer_state is not None else (None, None)
        mixed, mixer_state = self.mixer.step(self.mixer_norm(x), mixer_state, position)
        h = x + mixed
        if self.mlp is None:
            return h, LayerState(mixer_state, None)
        if self.mlp_has_state:
            out, mlp_state = self.mlp.step(self.mlp_norm(h), mlp_state, position)
        else:
            out = self.mlp(self.mlp_norm(h))
        return h + out, LayerState(mixer_state, mlp_state)


class CausalLM(nn.Module):
    """A decoder-only language model over a :class:`TokenMixer`, with decoding helpers.

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
        :mod:`mcsd.ops.kernels`) from now on: each mixer that calls an op reads its own
        ``kernels``; the config says the same. What the model computes does not change."""
        check_kernels(kernels)
        self.config = dataclasses.replace(self.config, kernels=kernels)
        for module in self.modules():
            if hasattr(module, "kernels"):
                module.kernels = kernels

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
        sequence = sum(batch * mixer.sequence_flops(length, form)
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

    def run(self, input_ids: torch.Tensor, state: DecodingState, form: str) -> tuple[torch.Tensor, DecodingState]:
        """Continue ``state`` with ``input_ids`` ``[B, N]`` in ``form``: the final-normed hidden states
        ``[B, N, D]`` of every position and the state after them."""
        if form not in self.architecture.forms:
            raise ConfigError(f"form={form!r} is not a form of {self.architecture.name}: use one of "
                              f"{', '.join(self.architecture.forms)}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: expected [batch, length]")
        x = self.streams.split(self.embed(input_ids))
        layers = []
        for layer, layer_state in zip(self.layers, state.layers):
            x, layer_state = layer(x, layer_state, state.position, form)
            layers.append(layer_state)
        hidden = self.streams.merge(self.final_norm(x))
        return hidden, DecodingState(position=state.position + input_ids.shape[1], layers=layers)

    def forward(
        self, input_ids: torch.Tensor, form: str | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, N, vocab]`` for every position (training and scoring), or ``[P, vocab]`` at
        ``positions`` alone (indices into the flattened ``[B * N]`` positions: the LM head reads
        only those, e.g. MQAR's answers). A forward call, so FSDP2 gathers the root's weights."""
        hidden = self.hidden_states(input_ids, form)
        return self.lm_head(hidden if positions is None else hidden.flatten(0, 1)[positions])

    def loss(
        self, input_ids: torch.Tensor, targets: torch.Tensor, form: str | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean next-token cross-entropy (fp32) of :meth:`forward`'s logits against ``targets``
        ``[B, N]`` (``-100``: not scored), and the logits: what a training step differentiates.
        With ``positions`` (indices into the flattened ``[B * N]`` positions, e.g. MQAR's answers),
        the LM head reads those positions alone and ``targets`` ``[P]`` are theirs."""
        logits = self(input_ids, form, positions)
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

    def hidden_states(self, input_ids: torch.Tensor, form: str | None = None) -> torch.Tensor:
        """The final-normed hidden states ``[B, N, D]`` that the LM head reads (a loss on a few
        positions applies ``lm_head`` to those alone)."""
        fresh = DecodingState(position=0, layers=[None] * len(self.layers))
        hidden, _ = self.run(input_ids, fresh, form or self.default_form)
        return hidden

    def prefill(
        self, input_ids: torch.Tensor, state: DecodingState | None = None, max_new_tokens: int = 0,
        form: str = PREFILL_FORM,
    ) -> tuple[torch.Tensor, DecodingState]:
        """Process a prompt (or continue ``state`` with more tokens), in the chunkwise form
        unless ``form`` says otherwise.

        Returns the last position's logits ``[B, vocab]`` and the state to decode from. Any
        number of :meth:`step` calls may follow; ``max_new_tokens`` is only a hint (a KV
        cache preallocates that much room and otherwise grows geometrically). The state is
        advanced in place: ``copy.deepcopy`` a state that is to be continued twice.
        """
        if state is None:
            state = self.init_state(input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
        hidden, state = self.run(input_ids, state, form)
        return self.lm_head(hidden[:, -1]), state

    def step(self, token_ids: torch.Tensor, state: DecodingState) -> tuple[torch.Tensor, DecodingState]:
        """Decode one token per batch row: ``token_ids`` ``[B]`` -> logits ``[B, vocab]``, through
        each layer's :meth:`Layer.step` (the recurrent form's numbers, without its sequence axis)."""
        hidden, state = self.step_hidden(token_ids, state)
        return self._head(hidden), state

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head of a decoding step's final-normed hidden states ``[B, D]``."""
        if torch.compiler.is_compiling() and hidden.shape[0] == 1 and hidden.device.type == "cpu":
            # The LM head of a batch-1 step compiled for a CPU as a multiply-and-sum that inductor
            # fuses into one reduction kernel, as decompose_mm_pass does for the smaller products
            # (its limit of 2048 rows leaves a vocabulary's head to a BLAS call, 1.5-2x slower).
            return (hidden[:, None, :] * self.lm_head.weight).sum(-1)
        return self.lm_head(hidden)

    def step_hidden(self, token_ids: torch.Tensor, state: DecodingState) -> tuple[torch.Tensor, DecodingState]:
        """:meth:`step` up to the final-normed hidden state ``[B, D]`` that the LM head reads."""
        hidden, layers = self._step_layers(token_ids, state.layers, state.position)
        return hidden, DecodingState(position=state.position + 1, layers=layers)

    def _step_layers(
        self, token_ids: torch.Tensor, layers: list[LayerState | None], position: int | torch.Tensor
    ) -> tuple[torch.Tensor, list[LayerState]]:
        x = self.streams.split(self.embed(token_ids.reshape(-1, 1)))[:, 0]
        advanced = []
        for layer, layer_state in zip(self.layers, layers):
            x, layer_state = layer.step(x, layer_state, position)
            advanced.append(layer_state)
        return self.streams.merge(self.final_norm(x)[:, None])[:, 0], advanced

    def static_step(self, token_ids: torch.Tensor, layers: list[LayerState], position: torch.Tensor) -> torch.Tensor:
        """:meth:`step` at fixed addresses, what a CUDA graph replays (:class:`mcsd.models.static_decoding.StaticStep`):
        ``position`` is a 0-d tensor on the model's device, not a Python int, and every layer's new
        state is written into the tensors of ``layers`` (each KV cache with room for the token);
        returns the logits ``[B, vocab]``. Each mixer's step takes a tensor ``position``: a KV
        cache writes at it and attends over its whole capacity, masked past it."""
        hidden, advanced = self._step_layers(token_ids, layers, position)
        state_tensors = [tensor for layer_state in layers for tensor in tensors_of(layer_state)]
        new_tensors = [tensor for layer_state in advanced for tensor in tensors_of(layer_state)]
        if len(state_tensors) != len(new_tensors):
            raise ValueError("a layer's step made a state of another structure than it was given: a static "
                             "step needs every layer's state from the start (prefill the prompt first)")
        for old, new in zip(state_tensors, new_tensors):
            if new is not old:  # a mixer that made a new state (the in-place ones return their own)
                old.copy_(new)
        return self._head(hidden)

    def step_function(
        self, compile: bool = False
    ) -> Callable[[torch.Tensor, DecodingState], tuple[torch.Tensor, DecodingState]]:
        """:meth:`step`, or with ``compile`` its ``torch.compile``d twin (one graph for every
        position, batch size and cache length, built on its first calls and kept for this
        model). The compiled step computes the same function: its logits differ from the eager
        step's by float rounding (about 1e-7 here).

        On a CPU a batch of one row compiles to a graph of its own, in which inductor's
        ``decompose_mm_pass`` turns each matrix-vector product (weights of at most 2048 x 2048)
        into a fused multiply-and-sum kernel: it reads the weights at about twice the rate of
        the BLAS call it replaces, which at batch 1 is most of the step's cost
        (``experiments/decode_gemv_before_after/``); the LM head, over the pass's limit, is
        written as such a kernel by :meth:`step` itself (``experiments/decode_head_before_after/``).
        Larger batches keep the BLAS products."""
        if not compile:
            return self.step
        if self.embed.weight.device.type == "cuda":
            return compiled_method(_COMPILED_STEPS, self, "step", dynamic=True)
        return compiled_method(_COMPILED_STEPS, self, "step", dynamic=True, options=CPU_STEP_COMPILE_OPTIONS)

    def decoding(self, compile: bool = False, cuda_graphs: bool = False) -> Decoding:
        """The prefill and the step that decoding runs: :meth:`prefill` and :meth:`step_function`,
        or with ``cuda_graphs`` a :class:`~mcsd.models.static_decoding.StaticStep` (the step at
        fixed addresses, recorded as a CUDA graph once per batch size and KV-cache capacity and
        replayed; compiled first with ``compile``) and its prefill, which reads a prompt into
        the step's own KV caches. ``cuda_graphs`` needs the model on a CUDA device."""
        if not cuda_graphs:
            return Decoding(self.prefill, self.step_function(compile))
        if self.embed.weight.device.type != "cuda":
            raise ConfigError(f"cuda_graphs=true needs a model on a CUDA device (this one is on "
                              f"{self.embed.weight.device}): set cuda_graphs=false, or device=cuda")
        step = StaticStep(self, compile=compile, record="cuda")
        return Decoding(step.prefill, step)

    @torch.inference_mode()
    def stream(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
        compile: bool = False,
        cuda_graphs: bool = False,
    ) -> Iterator[torch.Tensor]:
        """Yield each new token ``[B]`` as it is decoded (prefill once, then one step each).

        ``temperature=0`` is greedy; otherwise sampled with optional ``top_k``/``top_p``.
        Rows that produced ``eos_token_id`` keep yielding it; decoding stops once all have.
        ``compile`` decodes with the compiled step, ``cuda_graphs`` with the step replayed as
        CUDA graphs (:meth:`decoding`).
        """
        prefill, step = self.decoding(compile, cuda_graphs)
        logits, state = prefill(input_ids, max_new_tokens=max_new_tokens)
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for index in range(max_new_tokens):
            token = sample_next_token(logits, temperature, top_k, top_p, generator)
            if eos_token_id is not None:
                token = token.masked_fill(finished, eos_token_id)
                finished |= token == eos_token_id
            yield token
            if index + 1 == max_new_tokens or bool(finished.all()):
                return
            logits, state = step(token, state)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, **sampling: Any) -> torch.Tensor:
        """The prompt followed by up to ``max_new_tokens`` decoded tokens, ``[B, N + new]``."""
        tokens = list(self.stream(input_ids, max_new_tokens, **sampling))
        if not tokens:
            return input_ids
        return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)


CPU_STEP_COMPILE_OPTIONS: dict[str, Any] = {"post_grad_fusion_options": {"decompose_mm_pass": {}}}
"""Inductor's options for a decoding step compiled for a CPU: matrix products of one row (the
batch-1 step's, whose batch size the compiler then knows) as fused multiply-and-sum kernels."""

_COMPILED_STEPS: weakref.WeakKeyDictionary[CausalLM, Callable] = weakref.WeakKeyDictionary()
_COMPILED_LOSSES: weakref.WeakKeyDictionary[CausalLM, Callable] = weakref.WeakKeyDictionary()


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row from ``logits`` ``[B, vocab]``: argmax, or a filtered sample."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative - sorted_logits.softmax(dim=-1) > top_p  # keep the first token always
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
