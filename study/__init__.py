"""The study: variants x seeds pretraining runs, every task on every checkpoint, one report with seed noise.

    make study VARIANTS="softmax entmax" SEEDS=2 TASKS="knn voc pib" PRESET=tiny [DRY_RUN=1] [LAUNCHER=slurm]
    python -m study --variants "softmax entmax" --seeds 2 --tasks "knn voc pib" --preset tiny --dry-run

It drives the project's own command lines as subprocesses (``lightning_modules.pretrain``, ``probes.run``,
``analysis.run``) and keeps its state under ``runs/study/<name>/`` (docs/study.md).
"""
