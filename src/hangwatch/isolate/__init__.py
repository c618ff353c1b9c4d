"""``hangwatch isolate``: toggles, the matrix file, the trial plan, each trial's run, the conclusion."""
