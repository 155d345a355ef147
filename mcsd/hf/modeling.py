"""Every registered architecture as a ``transformers`` model: ``MCSDHFModel`` (hidden states)
and ``MCSDHFForCausalLM`` (logits, loss and ``generate``), both holding the project's
:class:`~mcsd.models.CausalLM` as ``model``.

- A forward without a cache (``use_cache=False``, or in training mode) runs the architecture's
  training form: the logits of ``CausalLM.forward``. With a cache it reads the tokens in the prefill form and, one
  token at a time, runs the lean step of ``mcsd-generate``. ``inputs_embeds`` replaces the
  embeddings; ``output_hidden_states`` gives each layer's input and the final-normed output.
- Padding, either side, in one batched pass, each row exactly as alone: every model reads a row
  from its first token (MCSD's slope normaliser and every recurrent state depend on the
  position), so a padded batch runs as packed documents (:class:`PaddedBatch`: each row turned
  so that its tokens end at the last column, its padding one document before them), and with a
  cache each row decodes on at its own position (``DecodingState.positions``).
- Beam search reorders the decoding state; assisted decoding needs a cache crop, which only an
  attention-only model has: ``generate`` refuses it for the others in one line, before ``transformers``
  would (``_is_stateful`` up to 5.24, the cache's ``is_croppable`` after the prefill from 5.25).
- Activation checkpointing (``gradient_checkpointing_enable``, ``Trainer(gradient_checkpointing=True)``)
  is the project's own, per layer; ``resize_token_embeddings`` resizes the wrapped model's config too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import can_return_tuple

from mcsd.errors import MCSDError
from mcsd.hf.cache import CACHE_KEY, DecodingCache
from mcsd.hf.configuration import MCSDHFConfig
from mcsd.models import CausalLM
from mcsd.models.build import build_model
from mcsd.models.decoding import PREFILL_FORM
from mcsd.models.modules.state import DecodingState

# generate()'s arguments that start assisted decoding (a draft model, prompt lookup, early exit).
ASSISTED_DECODING = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")


@dataclasses.dataclass
class PaddedBatch:
    """Where a padded batch's tokens are (``attention_mask`` ``[B, N]``, each row's tokens one
    run): each row's token count, its padding before them, and its padding after them (how far
    to turn the row so that it ends at the last column, all its padding first)."""

    lengths: torch.Tensor  # [B]
    before: torch.Tensor  # [B]
    after: torch.Tensor  # [B]

    @classmethod
    def of(cls, attention_mask: torch.Tensor | None) -> PaddedBatch | None:
        """The layout of ``attention_mask``; ``None`` when nothing is padded, and while
        ``torch.export`` traces (a branch on the mask's values has no graph: an exported program
        reads every row from its first column, which right padding leaves exact)."""
        if attention_mask is None or attention_mask.dim() != 2 or torch.compiler.is_exporting():
            return None
        mask = attention_mask.bool()
        if bool(mask.all()):
            return None
        runs = (mask & ~torch.nn.functional.pad(mask, (1, 0))[:, :-1]).sum(1)
        if bool((runs != 1).any()):
            row = int((runs != 1).nonzero()[0, 0])
            what = "no tokens" if int(runs[row]) == 0 else "padding between its tokens"
            raise MCSDError(f"attention_mask row {row} has {what}: pad each row before or after its tokens, "
                            "which stay in one run")
        return cls(mask.sum(1), mask.int().argmax(1), mask.flip(1).int().argmax(1))

    @property
    def left_padded(self) -> bool:
        """Whether a row has padding before its tokens (a causal forward alone is then not exact)."""
        return bool((self.before > 0).any())

    def turned(self, tensor: torch.Tensor, back: bool = False) -> torch.Tensor:
        """``tensor`` ``[B, N, ...]`` with each row turned by its padding after its tokens (moved
        before them), or turned back (``back``)."""
        width = tensor.shape[1]
        shift = -self.after if back else self.after
        index = (torch.arange(width, device=tensor.device)[None, :] - shift[:, None]) % width
        return tensor.gather(1, index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand_as(tensor))

    def position_ids(self, width: int) -> torch.Tensor:
        """Of the turned batch: its padding one document from 0, the row's tokens the next."""
        columns = torch.arange(width, device=self.lengths.device)[None, :]
        padding = (width - self.lengths)[:, None]
        return torch.where(columns < padding, columns, columns - padding)


def either_cache(cache: DecodingCache | None, past_key_values: DecodingCache | None) -> DecodingCache | None:
    """The decoding cache a forward was given, by either name (``cache`` from ``transformers`` 5.24,
    ``past_key_values`` before), refusing two."""
    if cache is not None and past_key_values is not None:
        raise MCSDError("forward() was given both cache and past_key_values: pass the decoding cache once")
    return cache if cache is not None else past_key_values


class MCSDHFPreTrainedModel(PreTrainedModel):
    """What both classes share: the wrapped :class:`CausalLM`, its decoding cache and loading."""

    config_class = MCSDHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Layer"]
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}  # when tie_word_embeddings
    supports_gradient_checkpointing = True  # the layers' own activation checkpointing
    # One class for every architecture: stateful as a class (transformers' tests skip assisted decoding),
    # and an instance whose every layer's state rewinds (attention alone) says it is not.
    _is_stateful = True

    def __init__(self, config: MCSDHFConfig, model: CausalLM | None = None) -> None:
        super().__init__(config)
        if config.mcsd_model is None:
            raise MCSDError("config.mcsd_model is missing: build the config from a model config "
                            "(MCSDHFConfig(mcsd_model=...)) or load an exported folder")
        self.model = model if model is not None else build_model(config.mcsd_model)
        self.rewinds = all(layer.state_rewinds for layer in self.model.layers)
        if self.rewinds:
            self._is_stateful = False  # a KV cache crops back: assisted decoding works
        self.post_init()

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModel") -> None:
        """Nothing: ``transformers`` would copy this module's file beside a saved model, where the
        config's ``save_pretrained`` writes ``modeling_mcsd.py`` (:mod:`mcsd.hf.configuration`)."""

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func: Any = None,
                                    every_n_layers: int = 1) -> None:
        """``transformers``' activation checkpointing as the layers' own (``model.activation_checkpointing``):
        every ``every_n_layers``-th layer keeps only its input and recomputes the rest in the backward,
        through ``gradient_checkpointing_func`` where given."""
        for index, layer in enumerate(self.model.layers):
            layer.activation_checkpointing = enable and index % every_n_layers == 0
            if gradient_checkpointing_func is not None:
                layer.checkpoint_function = gradient_checkpointing_func

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether a layer checkpoints (``is_gradient_checkpointing``, its deprecated alias, reads this)."""
        return any(layer.activation_checkpointing for layer in self.model.layers)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> torch.nn.Embedding:
        """``PreTrainedModel.resize_token_embeddings``, with the wrapped model's config (``mcsd_model``,
        what a saved folder rebuilds the model from) given the new vocabulary size."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        size = embeddings.weight.shape[0]
        self.model.config.vocab_size = size
        self.config.mcsd_model = {**self.config.mcsd_model, "vocab_size": size}
        self.config.vocab_size = size
        return embeddings

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: the wrapped model initialises itself when built (the project's scheme, with its
        depth-scaled residual weights), and ``from_pretrained`` loads every weight."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own DecodingCache

    def _prepare_cache_for_generation(self, generation_config: Any, model_kwargs: dict[str, Any],
                                      generation_mode: Any, batch_size: int, max_cache_length: int) -> None:
        """``generate`` starts from an empty :class:`DecodingCache` (a KV cache preallocated for
        ``max_cache_length`` tokens, as ``mcsd-generate`` does), unless it was given one."""
        if model_kwargs.get(CACHE_KEY) is not None or generation_config.use_cache is False:
            super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size,
                                                  max_cache_length)
            return
        rows = batch_size * max(generation_config.num_beams, generation_config.num_return_sequences)
        model_kwargs[CACHE_KEY] = DecodingCache(self.model.init_state(rows, max_cache_length), rows,
                                                self.rewinds)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def hidden_states(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        cache: DecodingCache | None,
        use_cache: bool | None,
        inputs_embeds: torch.Tensor | None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
    ) -> tuple[torch.Tensor, DecodingCache | None, tuple[torch.Tensor, ...] | None, PaddedBatch | None]:
        """The final-normed hidden states ``[B, N, D]`` of ``input_ids`` or ``inputs_embeds`` (after
        the cache's tokens), the cache after them (``None`` without ``use_cache``) and, with
        ``output_hidden_states``, every layer's input and the final-normed output (``transformers``'
        convention: the embeddings first, ``num_hidden_layers + 1`` in all)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise MCSDError("forward() takes input_ids or inputs_embeds: pass one of them")
        if output_attentions:
            raise MCSDError("output_attentions=True: mcsd models form no attention weights (their attention runs in "
                            "fused scaled-dot-product kernels, their recurrent mixers have none); leave it False")
        if cache is not None and not isinstance(cache, DecodingCache):
            raise MCSDError(f"{CACHE_KEY} is a {type(cache).__name__}: mcsd models keep their own "
                            "DecodingCache (pass the one a previous call returned, or none)")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        output_hidden_states = (self.config.output_hidden_states if output_hidden_states is None
                                else output_hidden_states)
        layers: list[torch.Tensor] | None = [] if output_hidden_states else None
        tokens = input_ids if input_ids is not None else inputs_embeds[..., 0]
        # The mask of a fresh batch says where its padding is; later calls' (generate's, the new tokens
        # after the rows as given) change nothing: each row's state already knows where it is.
        padded = PaddedBatch.of(attention_mask) if cache is None or cache.state.position == 0 else None
        if cache is None and (not use_cache or self.training):  # training: its form, no state kept
            if padded is not None and padded.left_padded:  # right padding alone leaves a causal forward exact
                return self._padded_prefill(input_ids, inputs_embeds, padded, None, layers)
            empty = DecodingState(position=0, layers=[None] * len(self.model.layers))
            hidden, _ = self.model.run(input_ids, empty, self.model.default_form, inputs_embeds=inputs_embeds,
                                       layer_inputs=layers)
            return hidden, None, None if layers is None else (*layers, hidden), None
        if cache is None:
            cache = DecodingCache(self.model.init_state(tokens.shape[0], tokens.shape[1]), tokens.shape[0],
                                  self.rewinds)
        if padded is not None:
            return self._padded_prefill(input_ids, inputs_embeds, padded, cache, layers)
        if input_ids is not None and input_ids.shape[1] == 1 and cache.state.position > 0:
            hidden, cache.state = self.model.step_hidden(input_ids[:, 0], cache.state, layers)
            hidden, layers = hidden[:, None], None if layers is None else [layer[:, None] for layer in layers]
        else:
            if cache.state.positions is not None:
                raise MCSDError(f"forward() of {tokens.shape[1]} tokens on a padded batch's cache: its rows are at "
                                "different positions and go on one token at a time")
            hidden, cache.state = self.model.run(input_ids, cache.state, PREFILL_FORM, inputs_embeds=inputs_embeds,
                                                 layer_inputs=layers)
        return hidden, cache, None if layers is None else (*layers, hidden), None

    def _padded_prefill(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, padded: PaddedBatch,
        cache: DecodingCache | None, layers: list[torch.Tensor] | None,
    ) -> tuple[torch.Tensor, DecodingCache | None, tuple[torch.Tensor, ...] | None, PaddedBatch | None]:
        """A padded batch in one pass, each row exactly as alone: every row turned so that its
        tokens end at the last column, its padding one document before them (``position_ids``),
        the outputs turned back; with ``cache``, each row decodes on from its own position."""
        if not self.model.separates_documents:
            raise MCSDError(f"{self.config.architecture} (this implementation) cannot keep a padded row's padding "
                            "apart from its tokens: give it one row at a time, or rows padded on the right "
                            "without a cache (use_cache=False)")
        given = input_ids if input_ids is not None else inputs_embeds
        width = given.shape[1]
        ids = None if input_ids is None else padded.turned(input_ids)
        embeds = None if inputs_embeds is None else padded.turned(inputs_embeds)
        form = self.model.default_form if cache is None else PREFILL_FORM
        state = DecodingState(position=0, layers=[None] * len(self.model.layers)) if cache is None else cache.state
        turned_layers: list[torch.Tensor] | None = None if layers is None else []
        hidden, state = self.model.run(ids, state, form, padded.position_ids(width), inputs_embeds=embeds,
                                       layer_inputs=turned_layers)
        if cache is not None:
            cache.state = self.model.last_documents(state, padded.lengths, per_row=True)
        hidden = padded.turned(hidden, back=True)
        every = None if turned_layers is None else (*(padded.turned(layer, back=True) for layer in turned_layers),
                                                    hidden)
        return hidden, cache, every, padded


class MCSDHFModel(MCSDHFPreTrainedModel):
    """The model up to its final-normed hidden states (``AutoModel``)."""

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: DecodingCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: DecodingCache | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        hidden, cache, every, _ = self.hidden_states(input_ids, attention_mask, either_cache(cache, past_key_values),
                                                     use_cache, inputs_embeds, output_hidden_states, output_attentions)
        return BaseModelOutputWithPast(last_hidden_state=hidden, hidden_states=every, **{CACHE_KEY: cache})


class MCSDHFForCausalLM(MCSDHFPreTrainedModel, GenerationMixin):
    """The language model (``AutoModelForCausalLM``): logits, the shifted next-token loss of
    ``labels`` (``-100`` not scored; the loss of ``CausalLM.loss``) and ``generate``. On a padded
    batch, ``logits_to_keep=k`` keeps each row's last ``k`` tokens' logits (what ``generate``
    reads the next token from, on either side's padding)."""

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.model.lm_head = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: DecodingCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache: DecodingCache | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        hidden, cache, every, padded = self.hidden_states(input_ids, attention_mask,
                                                          either_cache(cache, past_key_values), use_cache,
                                                          inputs_embeds, output_hidden_states, output_attentions)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        if padded is not None and isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = padded.turned(hidden)  # the last positions of a padded batch: each row's last tokens
        logits = self.model.lm_head(hidden[:, kept])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=every, **{CACHE_KEY: cache})

    def generate(self, inputs: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """``GenerationMixin.generate``; a padded batch (either side) is decoded in one batch, each
        row exactly as alone (:meth:`hidden_states`), laid out as ``transformers`` lays it out:
        the rows as given, then their new tokens."""
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        self._check_unmasked_batch(input_ids, kwargs.get("attention_mask"), kwargs)
        self._check_assisted(kwargs)
        return super().generate(inputs, **kwargs)

    def _check_assisted(self, kwargs: dict[str, Any]) -> None:
        """Assisted decoding asked of a model whose recurrent state cannot be cropped back."""
        if self.rewinds:
            return
        config = kwargs.get("generation_config") or self.generation_config
        asked = [name for name in ASSISTED_DECODING
                 if kwargs.get(name) is not None or getattr(config, name, None) is not None]
        if asked:
            raise MCSDError(f"generate({asked[0]}=...): assisted decoding takes rejected draft tokens back by "
                            f"cropping the cache, and {self.config.architecture}'s recurrent state cannot be "
                            "cropped; decode without it")

    def _check_unmasked_batch(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                              kwargs: dict[str, Any]) -> None:
        """A batch given without a mask whose rows start with the pad token: padding that
        ``generate`` cannot tell from text when the pad token is the end-of-text token."""
        if input_ids is None or attention_mask is not None or input_ids.shape[0] < 2:
            return
        pad = kwargs.get("pad_token_id", self.generation_config.pad_token_id)
        eos = self.generation_config.eos_token_id
        if pad is not None and pad == eos and bool((input_ids[:, 0] == pad).any()):
            raise MCSDError(f"generate() on a batch whose rows start with the pad token ({pad}, also the end-of-text "
                            "token) and no attention_mask: padding cannot be told from text; pass the tokenizer's "
                            "attention_mask, or generate one row at a time (lm-eval: batch_size=1 for generation tasks)")


def as_hf_model(model: CausalLM, eos_token_id: int) -> MCSDHFForCausalLM:
    """``model`` (its weights, not a copy) as a ``transformers`` language model whose
    end-of-text, beginning and pad token is ``eos_token_id`` (the tokenizer's ``<|endoftext|>``)."""
    tokens = {"bos_token_id": eos_token_id, "eos_token_id": eos_token_id, "pad_token_id": eos_token_id}
    hf_model = MCSDHFForCausalLM(MCSDHFConfig(mcsd_model=model.config.to_dict(), **tokens), model=model)
    hf_model.generation_config = GenerationConfig(**tokens)
    return hf_model.train(model.training)
