"""Pieces shared by the multi-dimensional tensor-parallel modes (2D, 2.5D, 3D).

Each mode differs only in its Linear (SUMMA for 2D/2.5D, the cube algorithm for 3D) and in which
mesh axes split an activation; LayerNorm, the embeddings, the cross-entropy and what the two
Linears share (``GridLinear``) are written once here against a ``TpLayout``.
"""
