"""Training: the trainer, its step, optimizer and schedule, checkpoints, metrics sinks and validation."""
