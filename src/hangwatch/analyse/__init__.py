"""Pure logic over the model: phases, progress, causes, verdicts. No processes, no I/O."""
