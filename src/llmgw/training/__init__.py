"""LoRA training's node side: the training environment and the trainer run inside it (docs/training.md)."""
