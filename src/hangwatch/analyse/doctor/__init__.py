"""Doctor's judgements: host and environment checks, CUDA architecture coverage, NCCL settings."""
