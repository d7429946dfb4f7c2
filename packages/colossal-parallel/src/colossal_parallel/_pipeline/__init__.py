"""Pipeline parallelism over the mesh's ``pp`` axis (private; public names re-exported above)."""
