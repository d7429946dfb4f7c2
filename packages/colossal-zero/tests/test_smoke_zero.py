import colossal_zero


def test_every_public_name_imports():
    for name in colossal_zero.__all__:
        assert getattr(colossal_zero, name) is not None, name
    assert colossal_zero.__version__ == "0.1.0"
