"""Everything a training run attaches to the Trainer, one module per concern (YAML ``class_path``: the module's
full path, e.g. ``lightning_modules.callbacks.knn.KNNCheck``):

- ``images``: TensorBoard images of fixed validation images (``PretrainVisuals``, ``VoteMaps``);
- ``knn``: the k-NN check of the teacher (``KNNCheck``);
- ``dense_check``: the dense probe and semantic-diffusion check (``DenseProbeCheck``);
- ``periodic``: when a periodic check runs;
- ``summary``: summary.json (``RunSummary`` for DINO, ``SupervisedSummary``, on ``LossSummary``);
- ``keep_checkpoints``: the checkpoints of chosen training points (``KeepCheckpoints``);
- ``end_checkpoint``: last.ckpt holds the end of fit (``EndCheckpoint``, always on);
- ``progress``: the progress bar that reads the loss once per logging interval (``LogStepProgressBar``, always on).
"""
