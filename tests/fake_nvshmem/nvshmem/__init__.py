"""Stand-in for nvshmem4py on CPUs (see ../README.md)."""
