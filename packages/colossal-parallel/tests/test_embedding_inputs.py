"""Every sharded embedding refuses tables whose gradients would silently differ when sharded.

The check runs before the mesh is touched, so no process group is needed (mesh=None).
"""

import pytest
from torch import nn

import colossal_parallel as cp
from colossal_contracts import ConfigError

EMBEDDINGS = [n for n in cp.__all__ if "Embedding" in n]


@pytest.mark.parametrize("name", EMBEDDINGS)
@pytest.mark.parametrize(
    "kwargs", [{"padding_idx": 0}, {"max_norm": 1.0}, {"sparse": True}], ids=str
)
def test_non_plain_embedding_is_refused(name, kwargs):
    emb = nn.Embedding(16, 8, **kwargs)
    with pytest.raises(ConfigError, match=f"{name}.from_embedding supports plain nn.Embedding"):
        getattr(cp, name).from_embedding(emb, None)


def test_every_embedding_class_is_covered():
    assert len(EMBEDDINGS) == 8
