"""Placement policies: pure functions of a ``PolicyContext`` that return chunk ids (``Placement``
does the moves), so that ``simulate`` can replay any of them against Belady's MIN. Public names are
re-exported by ``colossal_chunk``."""
