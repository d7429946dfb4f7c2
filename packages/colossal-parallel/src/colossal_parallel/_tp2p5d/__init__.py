"""2.5D tensor parallelism (Tesseract: SUMMA on each of ``d`` stacked ``q x q`` grids).

The public names are re-exported from ``colossal_parallel``; import them from there.
"""
