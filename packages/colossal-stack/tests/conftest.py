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


@pytest.fixture(scope="session")
def world_preload():
    """The ranks of the suite's worlds start with the stack imported (colossal_testing)."""
    return ("colossal",)
