import pytest


@pytest.fixture(scope="session")
def world_preload():
    """The ranks of the suite's worlds start with colossal_parallel imported (colossal_testing)."""
    return ("colossal_parallel",)
