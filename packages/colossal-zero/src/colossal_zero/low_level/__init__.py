"""ZeRO stages 1 and 2: flat per-rank buckets (``_buckets``), the optimizer that shards fp32
masters and moments over them (``_optimizer``), its settings, memory formula and checkpoints.
Public names are re-exported by ``colossal_zero``."""
