import colossal_parallel


def test_every_public_name_imports():
    for name in colossal_parallel.__all__:
        assert getattr(colossal_parallel, name) is not None, name
    assert colossal_parallel.__version__ == "0.1.0"
