"""Every sharded embedding refuses tables whose gradients would silently differ when sharded.

The check runs before the mesh is touched, so no process group is needed (mesh=None).
"""

import pytest
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import grid, tp1d

CLASSES = {n: getattr(m, n) for m in (tp1d, grid) for n in m.__all__ if "Embedding" in n}
EMBEDDINGS = sorted(CLASSES)


@pytest.mark.parametrize("name", EMBEDDINGS)
@pytest.mark.parametrize(
    "kwargs", [{"padding_idx": 0}, {"max_norm": 1.0}, {"sparse": True}], ids=str
)
def test_non_plain_embedding_is_refused(name, kwargs):
    emb = nn.Embedding(16, 8, **kwargs)
    with pytest.raises(ConfigError, match=f"{name}.from_embedding supports plain nn.Embedding"):
        CLASSES[name].from_embedding(emb, None)


def test_every_embedding_class_is_covered():
    assert len(EMBEDDINGS) == 8
