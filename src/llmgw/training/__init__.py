"""Training: LoRA adapters trained on the cluster's own cards — jobs in the control plane, the environment and
the trainer on the node (docs/training.md)."""
