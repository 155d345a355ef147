"""Every registered architecture as a first-class Hugging Face ``transformers`` model.

Importing this package registers ``model_type="mcsd"`` with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM`` (``import mcsd`` alone does not: its names load on first use).
``mcsd-export`` writes a folder that ``from_pretrained`` loads, also in a process that never
imported mcsd (``trust_remote_code=True``: its remote code imports these classes from the installed package).
"""

from mcsd.runtime import quiet_torchao_import

quiet_torchao_import()  # before transformers imports it (where installed), which it does at once

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from mcsd.hf.cache import DecodingCache  # noqa: E402
from mcsd.hf.configuration import MODEL_TYPE, MCSDHFConfig  # noqa: E402
from mcsd.hf.modeling import MCSDHFForCausalLM, MCSDHFModel, MCSDHFPreTrainedModel, as_hf_model  # noqa: E402
from mcsd.hf.tokenizer import as_hf_tokenizer  # noqa: E402

AutoConfig.register(MODEL_TYPE, MCSDHFConfig, exist_ok=True)
AutoModel.register(MCSDHFConfig, MCSDHFModel, exist_ok=True)
AutoModelForCausalLM.register(MCSDHFConfig, MCSDHFForCausalLM, exist_ok=True)

__all__ = ["DecodingCache", "MCSDHFConfig", "MCSDHFForCausalLM", "MCSDHFModel", "MCSDHFPreTrainedModel",
           "MODEL_TYPE", "as_hf_model", "as_hf_tokenizer"]
