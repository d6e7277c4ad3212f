"""llmgw.gateway."""
