"""Coordinators: local (a SQLite lease row with a term counter)."""
