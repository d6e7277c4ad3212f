"""llmgw.mirror."""
