"""Tests of llmgw.gateway."""
