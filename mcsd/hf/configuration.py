"""The Hugging Face config of every mcsd model: one ``model_type`` (``mcsd``) for every
registered architecture, holding the project's resolved model config and the standard fields
that ``transformers`` and its users read. Saving it (``save_pretrained``: the model's, an
export's, ``Trainer.save_model``'s, ``push_to_hub``'s) writes the remote code beside it, so that
every saved folder loads with ``trust_remote_code=True`` in a process that never imported mcsd."""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig

from mcsd.models import make_config, registry

MODEL_TYPE = "mcsd"  # ours alone: no other package's "retnet" or "transformer" is shadowed
REMOTE_CODE_FILE = "modeling_mcsd.py"  # mcsd/hf/remote_code.py, which imports the installed package's classes
AUTO_MAP = {"AutoConfig": "modeling_mcsd.MCSDHFConfig", "AutoModel": "modeling_mcsd.MCSDHFModel",
            "AutoModelForCausalLM": "modeling_mcsd.MCSDHFForCausalLM"}


def write_remote_code(folder: str | os.PathLike) -> None:
    """``modeling_mcsd.py`` in ``folder``: what the ``auto_map`` of a saved config names."""
    shutil.copyfile(resources.files("mcsd.hf") / "remote_code.py", Path(folder) / REMOTE_CODE_FILE)


class MCSDHFConfig(PreTrainedConfig):
    """``mcsd_model`` is the resolved model config (its ``_target_`` names the architecture's
    config class, as in a saved model's ``config.json``); ``architecture``, ``vocab_size``,
    ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` (MCSD's channels, the heads of
    the others) and ``tie_word_embeddings`` are read from it."""

    model_type = MODEL_TYPE

    mcsd_model: dict[str, Any] | None = None
    architecture: str | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
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
            self.num_hidden_layers, self.num_attention_heads = config.num_layers, config.num_channels
            self.tie_word_embeddings = config.tie_embeddings
        super().__post_init__(**kwargs)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing: ``transformers`` would copy this module's file beside a saved config, where
        :meth:`save_pretrained` writes ``modeling_mcsd.py`` instead."""

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any) -> None:
        """``config.json`` with the ``auto_map`` to ``modeling_mcsd.py``, and that file beside it."""
        self.auto_map = dict(AUTO_MAP)
        os.makedirs(save_directory, exist_ok=True)
        write_remote_code(save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
