"""``llmgw console``: the cluster in a terminal, full screen (docs/console.md)."""
