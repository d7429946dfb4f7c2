import colossal_chunk


def test_every_public_name_imports():
    for name in colossal_chunk.__all__:
        assert getattr(colossal_chunk, name) is not None, name
    assert colossal_chunk.__version__ == "0.1.0"
