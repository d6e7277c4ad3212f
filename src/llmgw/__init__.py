"""llmgw: one OpenAI-compatible endpoint over a fleet of machines with GPUs."""

__version__ = "0.1.0"
