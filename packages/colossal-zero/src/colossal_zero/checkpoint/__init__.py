"""The sharded checkpoint format that Gemini and ZeRO-1/2 both write and read (either loads the
other's): its layout, the index check, and the reader. Public names are re-exported by
``colossal_zero``."""
