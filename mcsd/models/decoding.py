"""Decoding on top of the skeleton: a prompt read in one pass (:meth:`DecodingMixin.prefill`),
then one token per step (:meth:`~DecodingMixin.step`, compiled or replayed as CUDA graphs:
:mod:`mcsd.models.cuda_graphs`), greedy or sampled (:func:`sample_next_token`).

:class:`DecodingMixin` is a base of :class:`mcsd.models.modeling.CausalLM` (kept apart as
transformers keeps generation in its ``GenerationMixin``): it reads the model through what the
skeleton defines, ``run`` (a sequence in a form), ``init_state``, ``embed``, ``layers``,
``streams``, ``final_norm`` and ``lm_head``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mcsd.models.config import ConfigError
from mcsd.models.cuda_graphs import StaticStep
from mcsd.models.modules.compiled import compiled_method
from mcsd.models.modules.state import Decoding, DecodingState, LayerState, tensors_of

if TYPE_CHECKING:
    from mcsd.ops.context import ForwardContext

PREFILL_FORM = "chunk"  # the form a prompt is read in before decoding


class DecodingMixin:
    """Prefill, step, the step at fixed addresses, and decoding loops of a :class:`CausalLM`."""

    layers: nn.ModuleList
    embed: nn.Embedding
    lm_head: nn.Linear
    final_norm: nn.Module
    streams: nn.Module

    if TYPE_CHECKING:
        def run(self, input_ids: torch.Tensor, state: DecodingState, form: str,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, DecodingState]: ...
        def init_state(self, batch_size: int, capacity: int = 0) -> DecodingState: ...
        def step_context(self) -> ForwardContext: ...

    def prefill(
        self, input_ids: torch.Tensor, state: DecodingState | None = None, max_new_tokens: int = 0,
        form: str = PREFILL_FORM, position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, DecodingState]:
        """Process a prompt (or continue ``state`` with more tokens), in the chunkwise form
        unless ``form`` says otherwise.

        Returns the last position's logits ``[B, vocab]`` and the state to decode from. Any
        number of :meth:`step` calls may follow; ``max_new_tokens`` is only a hint (a KV
        cache preallocates that much room and otherwise grows geometrically). The state is
        advanced in place: ``copy.deepcopy`` a state that is to be continued twice.

        ``position_ids`` ``[B, N]``: a packed prompt of documents apart (:meth:`CausalLM.run`);
        decoding goes on in each row's last document. Rows that end at different positions of
        theirs (a left-padded batch: the padding one document, the prompt the next) decode each
        at its own position (``DecodingState.positions``), one token at a time.
        """
        if state is None:
            state = self.init_state(input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
        hidden, state = self.run(input_ids, state, form, position_ids)
        if position_ids is not None:
            state = self.last_documents(state, position_ids[:, -1] + 1)
        return self.lm_head(hidden[:, -1]), state

    def last_documents(self, state: DecodingState, ends: torch.Tensor, per_row: bool = False) -> DecodingState:
        """The state after a packed run, for decoding each row's last document on, that document
        ending at position ``ends[b]`` of its own: one position when every row's is alike (unless
        ``per_row``), else each row at its own (``positions``), every entry of a KV cache kept."""
        if not per_row and bool((ends == ends[0]).all()):
            length = int(ends[0])
            return DecodingState(position=length, layers=[layer.last_document(layer_state, length)
                                                          for layer, layer_state in zip(self.layers, state.layers)])
        rows = ends.repeat(self.streams.count)  # every stream's rows alike (stream-major)
        return DecodingState(position=state.position, positions=ends,
                             layers=[layer.last_document(layer_state, rows)
                                     for layer, layer_state in zip(self.layers, state.layers)])

    def step(self, token_ids: torch.Tensor, state: DecodingState) -> tuple[torch.Tensor, DecodingState]:
        """Decode one token per batch row: ``token_ids`` ``[B]`` -> logits ``[B, vocab]``, through
        each layer's :meth:`Layer.step` (the recurrent form's numbers, without its sequence axis)."""
        hidden, state = self.step_hidden(token_ids, state)
        return self._head(hidden), state

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head of a decoding step's final-normed hidden states ``[B, D]``."""
        weight = self.lm_head.weight
        if (torch.compiler.is_compiling() and hidden.shape[0] == 1 and hidden.device.type == "cpu"
                and type(weight) in (torch.Tensor, nn.Parameter)):  # not a quantized weight (mcsd.deploy)
            # The LM head of a batch-1 step compiled for a CPU as a multiply-and-sum that inductor
            # fuses into one reduction kernel, as decompose_mm_pass does for the smaller products
            # (its limit of 2048 rows leaves a vocabulary's head to a BLAS call, 1.5-2x slower).
            return (hidden[:, None, :] * weight).sum(-1)
        return self.lm_head(hidden)

    def step_hidden(self, token_ids: torch.Tensor, state: DecodingState,
                    layer_inputs: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, DecodingState]:
        """:meth:`step` up to the final-normed hidden state ``[B, D]`` that the LM head reads;
        ``layer_inputs`` gets each layer's input ``[B, D]`` (:meth:`CausalLM.run`)."""
        if state.positions is None:
            hidden, layers = self._step_layers(token_ids, state.layers, state.position, layer_inputs)
            return hidden, DecodingState(position=state.position + 1, layers=layers)
        rows = state.positions.repeat(self.streams.count)  # every stream's rows alike (stream-major)
        hidden, layers = self._step_layers(token_ids, state.layers, rows, layer_inputs)
        return hidden, DecodingState(position=state.position + 1, layers=layers, positions=state.positions + 1)

    def _step_layers(
        self, token_ids: torch.Tensor, layers: list[LayerState | None], position: int | torch.Tensor,
        layer_inputs: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[LayerState]]:
        x = self.streams.split(self.embed(token_ids.reshape(-1, 1)))[:, 0]
        context = self.step_context()
        advanced = []
        for layer, layer_state in zip(self.layers, layers):
            if layer_inputs is not None:
                layer_inputs.append(self.streams.merge(x[:, None])[:, 0])
            x, layer_state = layer.step(x, layer_state, position, context)
            advanced.append(layer_state)
        return self.streams.merge(self.final_norm(x)[:, None])[:, 0], advanced

    def static_step(self, token_ids: torch.Tensor, layers: list[LayerState], position: torch.Tensor) -> torch.Tensor:
        """:meth:`step` at fixed addresses, what a CUDA graph replays (:class:`mcsd.models.cuda_graphs.StaticStep`):
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

    def step_entries(
        self, token_ids: torch.Tensor, layers: list[LayerState], position: torch.Tensor
    ) -> tuple[torch.Tensor, list[LayerState]]:
        """One token per row at the 0-d tensor ``position`` on ``layers`` whose KV caches are
        read-only (:class:`~mcsd.ops.attention.ReadOnlyKVCache`): the logits ``[B, vocab]``
        and each layer's state after the token, where a KV cache's is the token's entries alone
        (one position) for the caller to write at ``position``. What an ONNX export's step
        computes (:mod:`mcsd.deploy.onnx`), whose runner writes those entries in place."""
        hidden, advanced = self._step_layers(token_ids, layers, position)
        return self._head(hidden), advanced

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
        or with ``cuda_graphs`` a :class:`~mcsd.models.cuda_graphs.StaticStep` (the step at
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

_COMPILED_STEPS: weakref.WeakKeyDictionary[nn.Module, Callable] = weakref.WeakKeyDictionary()


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
