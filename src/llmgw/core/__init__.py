"""llmgw.core."""
