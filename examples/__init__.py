"""Examples to run beside pysched (`python -m examples.temporal_worker`)."""
