"""Settings: the config file, NCCL's environment, accepted ranges and durations, resolved once."""
