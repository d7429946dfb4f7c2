"""The disk tier: the store of memory-mapped payloads (``_store``) with its files, C library calls
and I/O counters, the placement's disk side (read-ahead, fault-ins, write-out, staging), the
read-ahead window and the disk payloads kept for chunks read elsewhere. Public names are
re-exported by ``colossal_chunk``."""
