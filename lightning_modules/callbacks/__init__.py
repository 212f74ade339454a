"""Everything a training run attaches to the Trainer, one module per concern (docs/layout.md lists them; YAML
``class_path``: the module's full path, e.g. ``lightning_modules.callbacks.knn.KNNCheck``).
"""
