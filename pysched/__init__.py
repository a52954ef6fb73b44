"""pysched: a distributed job scheduler for Python."""
