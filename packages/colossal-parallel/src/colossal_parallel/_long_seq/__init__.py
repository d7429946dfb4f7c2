"""Long-sequence parallelism over the mesh's ``sp`` axis (private; names re-exported above)."""
