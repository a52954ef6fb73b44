"""The run path's simulator: the real leader and worker code, on a virtual
clock, against the in-memory backends, with seeded faults; checks that no
run is lost or run twice. ``pysched-sim`` is its command line."""
