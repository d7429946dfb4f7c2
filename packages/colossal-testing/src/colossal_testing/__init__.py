"""colossal-testing: multi-process worlds for testing distributed code on one machine."""

from ._world import RankError, World, free_port

__version__ = "0.1.0"
__all__ = ["RankError", "World", "free_port"]
