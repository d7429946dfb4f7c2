"""1D (Megatron) tensor parallelism and sequence parallelism.

The public names are re-exported from ``colossal_parallel``; import them from there.
"""
