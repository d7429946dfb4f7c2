import colossal_memtrace


def test_every_public_name_imports():
    for name in colossal_memtrace.__all__:
        assert getattr(colossal_memtrace, name) is not None, name
    assert colossal_memtrace.__version__ == "0.1.0"
