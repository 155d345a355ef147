"""Corpora, tokenizers and the LightningDataModules (language modelling; MQAR; MAD's tasks and retrieval).

The names below load on first use: reading tokens or a tokenizer imports no Lightning."""

from mcsd.lazy import lazy_names

_HOMES = {"DataError": "mcsd.data.corpus", "LanguageModelDataModule": "mcsd.data.datamodule",
          "MQARDataModule": "mcsd.data.mqar", "TaskDataModule": "mcsd.data.tasks"}

__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
