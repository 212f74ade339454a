"""The probes' and analyses' one Lightning Trainer (``make_trainer``: what the trained kinds fit with; ``pass_trainer``:
what every feature pass predicts with), and the console of a run that builds several (``lightning_console``)."""
from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

from tokenmix.cli import Launch
from tokenmix.launch import ddp_strategy, wants_sync_batchnorm

# the logger of Lightning's rank-zero lines (device banner, tips); its handler is on "lightning.pytorch"
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
BANNER = ("GPU available:", "TPU available:")  # printed by every Trainer(...)
ADVERTISEMENT = "💡 Tip:"  # litlogger / litmodels, printed by every Trainer(...)


def make_trainer(launch: Launch, progress: bool = False, head: bool = True, **kw):
    """A Lightning Trainer on ``launch``: accelerator x devices x nodes (DDP with a process-group timeout when
    more than one process); our modules shard their own data (use_distributed_sampler=False). ``head``: a trained
    head's BatchNorm is synchronised over the processes (GPU)."""
    import lightning as L
    strategy = ddp_strategy("auto", launch.accelerator, launch.devices, launch.num_nodes, launch.dist_timeout)
    sync = head and wants_sync_batchnorm(strategy, launch.accelerator, "the probe head's BatchNorm")
    return L.Trainer(accelerator=launch.accelerator, devices=launch.devices, num_nodes=launch.num_nodes,
                     strategy=strategy, use_distributed_sampler=False, sync_batchnorm=sync,
                     enable_model_summary=False, enable_progress_bar=progress, **kw)


def pass_trainer(launch: Launch, progress: bool = False):
    """The Trainer of a feature pass (``features.sharded_predict``): predict only, no logger, no checkpoint."""
    return make_trainer(launch, progress, head=False, logger=False, enable_checkpointing=False)


class _OncePerRun(logging.Filter):
    """Lightning's device banner once, its advertisements never."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.getMessage())
        if msg.startswith(ADVERTISEMENT):
            return False
        line = next((b for b in BANNER if msg.startswith(b)), None)
        if line is None:
            return True
        first = line not in self.seen
        self.seen.add(line)
        return first


@contextmanager
def lightning_console() -> Iterator[None]:
    """One run's console: a layer sweep builds a Trainer per block (the retrieval probe two per block), and
    Lightning prints its device banner and a litlogger advertisement for each; here the banner appears once.

    Lightning also warns at every fit that modules are in eval mode: the frozen backbone is, on purpose
    (``FrozenFeatures``); that one warning is ignored for the run. The filter is set once around the whole run
    (a ``catch_warnings`` per Trainer would reset Python's once-per-location memory, and every other warning,
    e.g. a library's deprecation, would come back at each fit)."""
    from lightning.pytorch.utilities.warnings import PossibleUserWarning
    log = logging.getLogger(RANK_ZERO_LOGGER)
    once = _OncePerRun()
    log.addFilter(once)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode.*", category=PossibleUserWarning)
            yield
    finally:
        log.removeFilter(once)
