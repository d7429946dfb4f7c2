"""3D tensor parallelism (a ``q x q x q`` cube).

The public names are re-exported from ``colossal_parallel``; import them from there.
"""
