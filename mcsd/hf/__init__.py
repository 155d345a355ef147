"""Every registered architecture as a first-class Hugging Face ``transformers`` model.

Importing this package registers ``model_type="mcsd"`` with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM`` (``import mcsd`` imports it). ``mcsd-export`` writes a folder that
``from_pretrained`` loads, also in a process that never imported mcsd
(``trust_remote_code=True``: its remote code imports these classes from the installed package).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from mcsd.hf.cache import DecodingCache
from mcsd.hf.configuration import MODEL_TYPE, MCSDHFConfig
from mcsd.hf.modeling import MCSDHFForCausalLM, MCSDHFModel, MCSDHFPreTrainedModel, as_hf_model
from mcsd.hf.tokenizer import as_hf_tokenizer

AutoConfig.register(MODEL_TYPE, MCSDHFConfig, exist_ok=True)
AutoModel.register(MCSDHFConfig, MCSDHFModel, exist_ok=True)
AutoModelForCausalLM.register(MCSDHFConfig, MCSDHFForCausalLM, exist_ok=True)

__all__ = ["DecodingCache", "MCSDHFConfig", "MCSDHFForCausalLM", "MCSDHFModel", "MCSDHFPreTrainedModel",
           "MODEL_TYPE", "as_hf_model", "as_hf_tokenizer"]
