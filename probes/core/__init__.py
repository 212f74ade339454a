"""The shared core of every probe: the task table, the kinds registry, frozen features, the Trainer, the data."""
