"""What both data-parallel optimizers (Gemini and ZeRO-1/2) share: the Adam update, dynamic loss
scaling, training precisions and mesh-wide gradient norms. Public names are re-exported by
``colossal_zero``."""
