"""Points of training a study evaluates (``make study ... AT="25% 50% 100%"``).

Words of AT: ``25%`` (of ``max_epochs``, rounded to the nearest epoch end, at least 1), ``e3`` / ``epoch3`` (end
of epoch 3, 1-based), ``s100`` / ``step100`` (after optimizer step 100). The end of the schedule is the run's own
``last.ckpt`` (label ``""``, cell ids unchanged); other points are kept by ``KeepCheckpoints`` and their cells are
``<task>.<variant>.seed<s>@<label>``.

    >>> resolve_at("17% 50% 100%", max_epochs=6)
    ('e1', 'e3', '')
    >>> resolve_at("s40 e2", max_epochs=6), progress("s40", 6, final_step=150)
    (('e2', 's40'), 26.666666666666668)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

FINAL = ""
_WORD = re.compile(r"(?:(?P<pct>\d+(?:\.\d+)?)%|(?:e|epoch)(?P<e>\d+)|(?:s|step)(?P<s>\d+))")


def max_epochs(preset: Path, pretrain_args: Sequence[str] = ()) -> int:
    """``trainer.max_epochs`` of the preset YAML, overridden by ``--trainer.max_epochs[=]N`` in the extra flags."""
    import yaml
    value = ((yaml.safe_load(Path(preset).read_text()) or {}).get("trainer") or {}).get("max_epochs")
    args = list(pretrain_args)
    for i, a in enumerate(args):
        if a.startswith("--trainer.max_epochs="):
            value = a.split("=", 1)[1]
        elif a == "--trainer.max_epochs" and i + 1 < len(args):
            value = args[i + 1]
    if value is None:
        raise ValueError(f"AT needs trainer.max_epochs: neither {preset} nor --pretrain-args sets it")
    return int(value)


def parse_word(word: str, epochs: int) -> str:
    m = _WORD.fullmatch(word.strip().lower())
    if not m:
        raise ValueError(f"AT word {word!r}: expected a percentage of the schedule ('25%'), an epoch ('e3' or "
                         f"'epoch3', 1..{epochs}) or a step ('s100' or 'step100')")
    if m["pct"] is not None:
        pct = float(m["pct"])
        if not 0 < pct <= 100:
            raise ValueError(f"AT word {word!r}: a percentage in (0, 100]")
        e = max(1, min(epochs, int(pct / 100 * epochs + 0.5)))
    elif m["e"] is not None:
        e = int(m["e"])
        if not 1 <= e <= epochs:
            raise ValueError(f"AT word {word!r}: epoch {e} outside 1..{epochs} (max_epochs of the preset)")
    else:
        s = int(m["s"])
        if s < 1:
            raise ValueError(f"AT word {word!r}: steps count from 1")
        return f"s{s}"
    return FINAL if e == epochs else f"e{e}"


def resolve_at(at: str, max_epochs: int) -> tuple[str, ...]:
    """AT -> point labels, in training order (epochs and steps cannot be ordered against each other without the
    steps per epoch: epochs first, then steps, then the end); duplicates merged."""
    words = [w for w in str(at or "").replace(",", " ").split() if w]
    if not words:
        return (FINAL,)
    labels = {parse_word(w, max_epochs) for w in words}
    e = sorted((x for x in labels if x.startswith("e")), key=lambda x: int(x[1:]))
    s = sorted((x for x in labels if x.startswith("s")), key=lambda x: int(x[1:]))
    return tuple(e + s + ([FINAL] if FINAL in labels else []))


def keep_args(points: Sequence[str]) -> list[str]:
    """The pretraining flags that keep the checkpoints of the points other than the end (none: no flags)."""
    e = [int(p[1:]) for p in points if p.startswith("e")]
    s = [int(p[1:]) for p in points if p.startswith("s")]
    if not e and not s:
        return []
    return ["--trainer.callbacks+=lightning_modules.callbacks.keep_checkpoints.KeepCheckpoints",
            f"--trainer.callbacks.epochs=[{','.join(map(str, e))}]",
            f"--trainer.callbacks.steps=[{','.join(map(str, s))}]"]


def checkpoint_name(point: str) -> str:
    from lightning_modules.callbacks.keep_checkpoints import epoch_file, step_file
    if point == FINAL:
        return "last.ckpt"
    return epoch_file(int(point[1:])) if point.startswith("e") else step_file(int(point[1:]))


def progress(point: str, max_epochs: int, final_step: Optional[int] = None) -> Optional[float]:
    """Percent of the schedule a point stands at (a step point needs the run's final step; None without it)."""
    if point == FINAL:
        return 100.0
    if point.startswith("e"):
        return 100.0 * int(point[1:]) / max_epochs
    return 100.0 * int(point[1:]) / final_step if final_step else None


def describe_point(point: str, max_epochs: int) -> str:
    if point == FINAL:
        return f"end (epoch {max_epochs}, last.ckpt)"
    return f"epoch {point[1:]} of {max_epochs}" if point.startswith("e") else f"step {point[1:]}"
