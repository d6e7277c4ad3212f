"""llmgw.cli."""
