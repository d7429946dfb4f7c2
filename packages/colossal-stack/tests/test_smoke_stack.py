import colossal


def test_every_public_name_imports():
    for name in colossal.__all__:
        assert getattr(colossal, name) is not None, name
    assert colossal.__version__ == "0.1.0"
