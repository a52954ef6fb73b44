"""Pure-Python twins of the native core, behind the same interfaces.

They are the specification the native code is held to (hypothesis property
tests compare them) and the baseline the benchmarks measure against.
"""
