import pytest


@pytest.fixture
def small_corpus(tmp_path):
    """A few hundred KB of the standard library: enough text, fast to load."""
    from colossal_models import default_corpus_path

    root = default_corpus_path()
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("argparse.py", "dataclasses.py", "textwrap.py", "json/decoder.py"):
        src = root / name
        (folder / src.name).write_bytes(src.read_bytes())
    return folder


@pytest.fixture(autouse=True, scope="session")
def _data_cache(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Raw data that runs prepare goes to a scratch cache, not the user's ~/.cache."""
    import os

    old = os.environ.get("COLOSSAL_CACHE")
    os.environ["COLOSSAL_CACHE"] = str(tmp_path_factory.mktemp("colossal-cache"))
    yield
    if old is None:
        os.environ.pop("COLOSSAL_CACHE", None)
    else:
        os.environ["COLOSSAL_CACHE"] = old
