import colossal_parallel
from colossal_parallel import grid, pipeline, sequence, tp1d


def test_every_public_name_imports():
    for name in colossal_parallel.__all__:
        assert getattr(colossal_parallel, name) is not None, name
    for sub in (grid, pipeline, sequence, tp1d):
        for name in sub.__all__:
            assert getattr(sub, name) is not None, f"{sub.__name__}.{name}"
    assert colossal_parallel.__version__ == "0.1.0"
