"""Checkpoints out of Colossal: any plugin's checkpoint read in one process
(``read_checkpoint``) and written as a Hugging Face model folder (``export_hf``) with the
run's tokenizer files (``write_tokenizer_files``)."""

from ._hf_folder import export_after_training, export_hf, hf_config_of, hf_state_of
from ._source import CheckpointInfo, iter_checkpoint_state, read_checkpoint
from ._tokenizer_files import run_tokenizer, write_tokenizer_files

__all__ = [
    "CheckpointInfo",
    "export_after_training",
    "export_hf",
    "hf_config_of",
    "hf_state_of",
    "iter_checkpoint_state",
    "read_checkpoint",
    "run_tokenizer",
    "write_tokenizer_files",
]
