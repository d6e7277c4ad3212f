"""llmgw.observability: metrics shared by the processes."""
