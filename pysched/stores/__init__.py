"""Schedule stores: sqlite (embedded default)."""
