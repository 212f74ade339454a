"""Threshold passes of the Triton forward on real attention logits: per row, and per 64-row program (what its loop
costs: a program runs until its slowest row settles), the figure ``kernel_model.report --passes`` takes.

```
TRITON_INTERPRET=1 python -m kernel_model.threshold_passes                      # N = 37, 197, 257, 785, 1025
TRITON_INTERPRET=1 python -m kernel_model.threshold_passes --n 197 --rows 256 --json passes.json
```

Counts are the kernel's own (``backbones.triton_attention.threshold_passes``: exact fp32 scores through the
forward with COUNT), on the CUDA device or in the interpreter. Sources:

- ``vit``: a ViT-S/16 entmax-1.5 at random init (seed 0) on a real ImageNet photo of the fixtures, resized so that
  it has N tokens (96: 37, DINO's local crops; 224: 197; 256: 257; 448: 785; 512: 1025), layers 1, 6 and 11 (the
  12th has only the [CLS] query), the first ``--rows`` rows of heads 1 and 4: near-uniform rows, large supports;
- ``gauss-1``, ``gauss-3``, ``gauss-6``: rows of N scaled scores ~ N(0, sigma^2) (3: the spread of a trained
  model's logits, the kernel tests' "peaked" rows).

Paths: ``single`` (N <= 272: the register tile the 16-bit forward takes; first pass at t = -1) and ``block``
(the block-wise forward: max and first threshold pass fused, _gauss_root start).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
SIZES = {37: 96, 197: 224, 257: 256, 785: 448, 1025: 512}  # tokens -> image side of a ViT-S/16 (+ [CLS])
TILE = 64  # query rows per program of the 16-bit forward


def vit_logits(photo: Path, size: int, layers=(0, 5, 10), heads=(0, 3), rows: int | None = None) -> torch.Tensor:
    """Scaled attention scores (len(layers) * len(heads), rows, N) of a random-init ViT-S/16 (entmax-1.5) on
    one photo resized to ``size``."""
    import numpy as np
    from PIL import Image

    from backbones import create_vit
    from datamodules.datasets.base import image_tensor
    from datamodules.transforms import normalize
    x = normalize(image_tensor(np.asarray(Image.open(photo).convert("RGB").resize((size, size)))))[None]
    model = create_vit("vit_small_patch16", "entmax15", seed=0, img_size=size).eval()
    caught = []
    for i in layers:
        attn = model.blocks[i].attn
        attn.normalizer = lambda s, norm=attn.normalizer: (caught.append(s.detach().float()), norm(s))[1]
    with torch.no_grad():
        model(x)
    return torch.cat([c[0, list(heads), :rows] for c in caught])


def gauss_logits(n: int, sigma: float, rows: int, groups: int = 4) -> torch.Tensor:
    return torch.randn(groups, rows, n, generator=torch.Generator().manual_seed(23)) * sigma


def histogram(passes: torch.Tensor) -> dict:
    """Per row and per program (the max over each TILE consecutive rows of one group, or the group's rows where
    fewer) pass counts, passes (groups, rows)."""
    rows = passes.flatten()
    tile = min(TILE, passes.shape[1])  # N < 64 queries: one program holds them all
    g, r = passes.shape[0], passes.shape[1] // tile * tile
    tiles = passes[:, :r].reshape(g, -1, tile).amax(-1).flatten()
    hist = lambda x: {int(v): int(c) for v, c in zip(*x.unique(return_counts=True))}  # noqa: E731
    return dict(rows=hist(rows), row_median=float(rows.median()), row_mean=round(float(rows.float().mean()), 2),
                tiles=hist(tiles), tile_mean=round(float(tiles.float().mean()), 2))


def measure(ns, rows: int, photo: Path | None, paths=("single", "block")) -> list[dict]:
    from backbones import triton_attention as ta
    from backbones.triton_plan import _SINGLE_MAX
    out = []
    for n in ns:
        sources = [(f"gauss-{s:g}", gauss_logits(n, s, rows)) for s in (1.0, 3.0, 6.0)]
        if photo is not None and n in SIZES:
            sources.insert(0, ("vit", vit_logits(photo, SIZES[n], rows=rows)))
        for name, scores in sources:
            for single in [p == "single" for p in paths if p == "block" or n <= _SINGLE_MAX]:
                passes = ta.threshold_passes(scores, "entmax15", single=single)
                out.append(dict(source=name, n=n, path="single" if single else "block", **histogram(passes)))
                print(_line(out[-1]), flush=True)
    return out


def _line(r: dict) -> str:
    fmt = lambda h: " ".join(f"{k}:{v}" for k, v in sorted(h.items()))  # noqa: E731
    return (f"| {r['source']} | {r['n']} | {r['path']} | {fmt(r['rows'])} | {r['row_median']:g} | {r['row_mean']} | "
            f"{fmt(r['tiles'])} | {r['tile_mean']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, action="append", help=f"tokens (repeatable; default {sorted(SIZES)})")
    ap.add_argument("--rows", type=int, default=128, help="query rows per head / group (multiple of 64)")
    ap.add_argument("--photo", type=Path, default=None, help="an RGB photo (default: the fixtures' first)")
    ap.add_argument("--path", choices=("single", "block"), action="append", help="default: both")
    ap.add_argument("--json", help="write the histograms here")
    a = ap.parse_args(argv)
    from backbones import triton_attention as ta
    if not ta.available(torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")):
        sys.exit("kernel_model.threshold_passes runs the kernel: on a GPU, or with TRITON_INTERPRET=1")
    photo = a.photo or next(iter(sorted((FIXTURES / "imagenet_samples").glob("*.JPEG"))), None)
    print("| source | N | path | passes per row: count | median | mean | per 64-row program (max) | mean |")
    print("|---|---|---|---|---|---|---|---|")
    res = measure(a.n or sorted(SIZES), a.rows, photo, a.path or ("single", "block"))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
