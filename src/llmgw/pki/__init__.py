"""llmgw.pki."""
