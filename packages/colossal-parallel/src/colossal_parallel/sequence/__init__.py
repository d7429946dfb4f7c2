"""Long-sequence parallelism over the mesh's ``sp`` axis: ring attention and Ulysses
(all-to-all) attention, and the sequence layouts they split tokens by."""

from ._layout import SEQ_LAYOUTS, SeqLayout, check_sequence, sequence_positions
from ._ring import ring_attention, ring_attention_comm_bytes
from ._ulysses import all_to_all_along, ulysses_attention, ulysses_comm_bytes

__all__ = [
    "SEQ_LAYOUTS",
    "SeqLayout",
    "all_to_all_along",
    "check_sequence",
    "ring_attention",
    "ring_attention_comm_bytes",
    "sequence_positions",
    "ulysses_attention",
    "ulysses_comm_bytes",
]
