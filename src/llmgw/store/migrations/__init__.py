"""Alembic migrations of the store; Store.open runs them."""
