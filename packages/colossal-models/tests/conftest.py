import pytest


@pytest.fixture(scope="session")
def world_preload():
    """The ranks of the suite's worlds start with the models imported (colossal_testing)."""
    return ("colossal_models",)
