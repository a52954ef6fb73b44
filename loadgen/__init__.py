"""pysched-loadgen: replay the top-of-the-hour spike against a scheduler and
measure it from outside pysched's own bookkeeping."""
