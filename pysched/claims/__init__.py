"""Idempotency claims: sqlite (conditional insert)."""
