"""The probes' one Lightning Trainer: what the trained kinds fit with and the feature passes predict with."""
from __future__ import annotations

from tokenmix.launch import ddp_strategy, wants_sync_batchnorm


def make_trainer(args, **kw):
    """A Lightning Trainer on ``--accelerator`` x ``--devices`` x ``--num-nodes`` (DDP with a process-group
    timeout when more than one process); our modules shard their own data (use_distributed_sampler=False)."""
    import lightning as L
    strategy = ddp_strategy("auto", args.accelerator, args.devices, args.num_nodes, args.dist_timeout)
    return L.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
                     strategy=strategy, use_distributed_sampler=False,
                     sync_batchnorm=wants_sync_batchnorm(strategy, args.accelerator, "the probe head's BatchNorm"),
                     enable_model_summary=False, enable_progress_bar=args.progress, **kw)
