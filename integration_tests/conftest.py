import pytest


@pytest.fixture(scope="session")
def world_preload():
    """The ranks of the suite's worlds start with the stack imported (colossal_testing)."""
    return ("colossal",)
