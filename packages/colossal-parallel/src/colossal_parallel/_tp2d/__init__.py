"""2D tensor parallelism (SUMMA on a ``q x q`` grid).

The public names are re-exported from ``colossal_parallel``; import them from there.
"""
