"""llmgw.testing."""
