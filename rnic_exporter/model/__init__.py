"""The shared vocabulary: typed records of the host, its consumers and NCCL's rules; no I/O."""
