"""Training: the LightningModule, schedule and callbacks."""
