import colossal_contracts


def test_every_public_name_imports():
    for name in colossal_contracts.__all__:
        assert getattr(colossal_contracts, name) is not None, name
    assert colossal_contracts.__version__ == "0.1.0"
