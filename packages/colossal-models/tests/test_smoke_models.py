import colossal_models


def test_every_public_name_imports():
    for name in colossal_models.__all__:
        assert getattr(colossal_models, name) is not None, name
    assert colossal_models.__version__ == "0.1.0"
