"""Checkpoints out of Colossal: any plugin's checkpoint read in one process
(``read_checkpoint``) and written as a Hugging Face model folder (``export_hf``) with the
run's tokenizer files (``write_tokenizer_files``); a LoRA run's adapters as a PEFT folder
(``export_adapter``)."""

from ._hf_folder import export_after_training, export_hf, hf_config_of, hf_state_of
from ._lora import ADAPTER_FOLDER, export_adapter, lora_model, merged_state, with_adapter
from ._source import CheckpointInfo, iter_checkpoint_state, read_checkpoint
from ._tokenizer_files import run_tokenizer, write_tokenizer_files

__all__ = [
    "ADAPTER_FOLDER",
    "CheckpointInfo",
    "export_adapter",
    "export_after_training",
    "export_hf",
    "hf_config_of",
    "hf_state_of",
    "iter_checkpoint_state",
    "lora_model",
    "merged_state",
    "read_checkpoint",
    "run_tokenizer",
    "with_adapter",
    "write_tokenizer_files",
]
