"""Dispatchers: inprocess (a queue inside the node)."""
