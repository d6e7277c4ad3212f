"""What every llmgw process runs on: its clock and the supervisor of its long-lived components."""
