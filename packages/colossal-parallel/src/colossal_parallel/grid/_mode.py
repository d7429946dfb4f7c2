"""``ModeLayer``: what every multi-dimensional layer shares: its mesh, mode and layout."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from colossal_contracts import ConfigError

from .._mesh import ProcessMesh
from ._common import check_mode
from ._layout import TpLayout

__all__ = ["ModeLayer"]


class ModeLayer(nn.Module):
    """Base of the 2D / 2.5D / 3D layers: binds a mesh of the right mode and an input layout.

    Subclasses set ``MODE`` (the mesh's ``tp_mode``) and ``LAYOUTS`` (the layouts the mode's
    activations may have, the first being the default).
    """

    MODE: ClassVar[str]
    LAYOUTS: ClassVar[tuple[TpLayout, ...]]
    mesh: ProcessMesh
    layout: TpLayout  # layout of the input activation

    def __init__(self, mesh: ProcessMesh, layout: TpLayout | None) -> None:
        super().__init__()
        name = type(self).__name__
        check_mode(mesh, self.MODE, name)
        if layout is None:
            layout = self.LAYOUTS[0]
        if layout not in self.LAYOUTS:
            raise ConfigError(
                f"{name}: layout {layout} is not one of the {self.MODE} layouts {self.LAYOUTS}"
            )
        self.mesh = mesh
        self.layout = layout

    @property
    def out_layout(self) -> TpLayout:
        """Layout of the output activation (the input's unless the layer says otherwise)."""
        return self.layout

    def extra_repr(self) -> str:
        return f"mode={self.MODE}, layout=({','.join(self.layout.row_axes)} | {self.layout.hidden_axis})"
