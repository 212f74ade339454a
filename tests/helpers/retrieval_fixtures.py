"""Tiny copies of the image-level evaluation layouts, written as the real sets are laid out:

- revisitop (``write_revisitop``): ``<root>/<name>/jpg/<image>.jpg`` and ``<root>/<name>/gnd_<name>.pkl``
  holding ``imlist``, ``qimlist`` and ``gnd`` (per query ``bbx``, [x1, y1, x2, y2] floats, and ``easy`` /
  ``hard`` / ``junk`` int arrays); queries are not in the database.
- Copydays (``write_copydays``): ``original/``, ``strong/`` (Holidays-style numbering: original ``2000 00.jpg`` ->
  strong ``2000 01.jpg``, ``2000 02.jpg``: DINO's ground truth matches the first 4 characters), optional
  jpegqual / crops blocks with the originals' names, and ``whitening/`` / ``distractors/`` folders.

Images have uneven sizes (not multiples of any patch size) and random content.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from PIL import Image

from official import vit as vits  # facebookresearch/dino's VisionTransformer, transcribed (official/vit.py)


def _jpg(rng: np.random.Generator, path: Path, h: int, w: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    base = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)  # blocky: survives the JPEG coding
    img = np.kron(base, np.ones((4, 4, 1), dtype=np.uint8))[:h, :w]
    Image.fromarray(img).save(path, quality=95)
    return path


def write_revisitop(root: Path, name: str = "roxford5k", n_db: int = 12, n_q: int = 3, seed: int = 0,
                    scale: int = 1) -> dict:
    """The dataset under ``root/name`` (image sides x ``scale``); returns the pickled dict."""
    rng = np.random.default_rng(seed)
    base = Path(root) / name
    imlist = [f"{name[1:4]}_db_{i:03d}" for i in range(n_db)]
    qimlist = [f"{name[1:4]}_query_{i:02d}" for i in range(n_q)]
    gnd = []
    for q in qimlist:
        h, w = int(rng.integers(30, 60)) * scale, int(rng.integers(30, 60)) * scale
        _jpg(rng, base / "jpg" / f"{q}.jpg", h, w)
        x1, y1 = float(rng.integers(0, w // 3)), float(rng.integers(0, h // 3))
        bbx = [x1, y1, x1 + w / 2 + 0.4, y1 + h / 2 + 0.6]
        lists = np.array_split(rng.permutation(n_db)[: n_db // 2 + 2], 3)  # disjoint easy / hard / junk
        gnd.append({"bbx": bbx, "easy": lists[0].astype(np.int64), "hard": lists[1].astype(np.int64),
                    "junk": lists[2].astype(np.int64)})
    gnd[-1]["hard"] = np.zeros(0, dtype=np.int64)  # a query without hard positives: NaN in protocol H
    for i in imlist:
        _jpg(rng, base / "jpg" / f"{i}.jpg", int(rng.integers(24, 56)) * scale, int(rng.integers(24, 56)) * scale)
    cfg = {"imlist": imlist, "qimlist": qimlist, "gnd": gnd}
    with open(base / f"gnd_{name}.pkl", "wb") as f:
        pickle.dump(cfg, f)
    return cfg


def copydays_names(n_orig: int) -> tuple[list[str], list[str]]:
    """Original ``<4-digit series>00.jpg``; one strong attack of the even series, two of the odd ones."""
    originals = [f"{2000 + i}00.jpg" for i in range(n_orig)]
    strongs = [f"{2000 + i}{k + 1:02d}.jpg" for i in range(n_orig) for k in range(1 + i % 2)]
    return originals, strongs


def write_copydays(root: Path, n_orig: int = 4, blocks=("jpegqual/50", "crops/50"),
                   n_distractors: int = 16, n_whitening: int = 10, seed: int = 0) -> dict:
    """Copydays under ``root``; strong images are noisy copies of their original; returns the file names."""
    rng, root = np.random.default_rng(seed), Path(root)
    originals, strongs = copydays_names(n_orig)
    sizes = [(int(rng.integers(30, 50)), int(rng.integers(30, 50))) for _ in originals]
    for name, (h, w) in zip(originals, sizes):
        _jpg(rng, root / "original" / name, h, w)
    for name in strongs:
        h, w = sizes[int(name[:4]) - 2000]
        _jpg(rng, root / "strong" / name, h + 3, w - 2)
    for block in blocks:
        for name, (h, w) in zip(originals, sizes):
            _jpg(rng, root / block / name, h, w)
    for folder, n in (("distractors", n_distractors), ("whitening", n_whitening)):
        for i in range(n):
            _jpg(rng, root / folder / f"{folder[:4]}{i:04d}.jpg", int(rng.integers(24, 48)), int(rng.integers(24, 48)))
    return {"original": originals, "strong": strongs, "blocks": list(blocks)}


def vit_pair(seed: int = 0):
    """The project's ``vit_test_patch8`` and facebookresearch/dino's VisionTransformer (official/vit.py) holding
    the same weights, the final norm's scale and shift drawn unevenly so that descriptor norms differ."""
    from functools import partial

    import torch
    from torch import nn

    import backbones
    model = backbones.create_vit("vit_test_patch8", "softmax", seed=seed).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.norm.weight.copy_(torch.rand(model.embed_dim, generator=g) * 2 + 0.2)
        model.norm.bias.copy_(torch.randn(model.embed_dim, generator=g))
    ref = vits.VisionTransformer(img_size=(32,), patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4,
                                 qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    ref.load_state_dict(model.state_dict())
    return model, ref
