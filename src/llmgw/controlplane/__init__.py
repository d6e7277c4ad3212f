"""llmgw.controlplane."""
