"""Hugging Face remote code of a model exported by mcsd (``mcsd-export``), copied beside its
weights as ``modeling_mcsd.py``: it only imports the classes from the installed ``mcsd``
package (``pip install`` the mcsd harness), so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` works in any process."""

from mcsd.hf import MCSDHFConfig, MCSDHFForCausalLM, MCSDHFModel

__all__ = ["MCSDHFConfig", "MCSDHFForCausalLM", "MCSDHFModel"]
