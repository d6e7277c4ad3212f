"""llmgw.protocol."""
