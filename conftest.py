"""Shared by every suite that pytest runs from the repository root."""

import pytest


@pytest.fixture(scope="session")
def world_preload():
    """Modules the fork server of colossal_testing's worlds imports once, so that no rank imports
    them itself (the server is one per pytest process: the first world fixes its preload, so one
    list serves every suite). A module that is not installed (a package tested alone) is skipped."""
    return (
        "colossal",
        "colossal_models",
        "colossal_parallel",
        "transformers.models.gpt2.modeling_gpt2",
    )
