"""Training: LoRA adapters trained on the cluster's own cards (docs/training.md)."""
