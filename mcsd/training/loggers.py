"""Loggers of ours: Lightning's W&B logger without the argument W&B warns about."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger``, minus ``anonymous``: Lightning always passes it to
    ``wandb.init`` (as ``None``), and W&B warns on every run that the setting has no effect."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)
