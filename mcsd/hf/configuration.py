"""The Hugging Face config of every mcsd model: one ``model_type`` (``mcsd``) for every
registered architecture, holding the project's resolved model config and the standard fields
that ``transformers`` and its users read."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

from mcsd.models import make_config, registry

MODEL_TYPE = "mcsd"  # ours alone: no other package's "retnet" or "transformer" is shadowed


class MCSDHFConfig(PreTrainedConfig):
    """``mcsd_model`` is the resolved model config (its ``_target_`` names the architecture's
    config class, as in a saved model's ``config.json``); ``architecture``, ``vocab_size``,
    ``hidden_size``, ``num_hidden_layers`` and ``tie_word_embeddings`` are read from it."""

    model_type = MODEL_TYPE

    mcsd_model: dict[str, Any] | None = None
    architecture: str | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        if self.mcsd_model is not None:
            config = make_config(self.mcsd_model)
            self.mcsd_model = config.to_portable_dict()
            self.architecture = registry.of_config(config).name
            self.vocab_size, self.hidden_size = config.vocab_size, config.hidden_size
            self.num_hidden_layers = config.num_layers
            self.tie_word_embeddings = config.tie_embeddings
        super().__post_init__(**kwargs)
