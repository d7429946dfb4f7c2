"""Gemini: ZeRO-3 over colossal-chunk's chunks. The runtime that brings chunks to the compute tier
around every operator (``_runtime``), the optimizer that updates their fp32 shards chunk by chunk
(``_optimizer``), and their sharded checkpoints (``_checkpoint``). Public names are re-exported by
``colossal_zero``."""
