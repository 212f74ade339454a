"""A tiny DAVIS-2017 in the real layout: two short sequences of small frames with two moving objects each.

    JPEGImages/480p/<seq>/00000.jpg ...    textured background, a disc moving right, a square moving down
    Annotations/480p/<seq>/00000.png ...   indexed PNGs in DAVIS's palette: 0 background, 1 disc, 2 square,
                                           a few 255 (void) pixels on one frame's disc border
    ImageSets/2017/val.txt                 the two sequence names

Frames are 72x136 (HxW), DAVIS's aspect ratio nearly: DINO's rule resizes them to 480x896 (tests that run the
official loop use a 64 px short side: 64x128). Returns {sequence: (frames (T, H, W, 3) uint8 RGB as written to
JPEG, masks (T, H, W) as written)}.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from datamodules.datasets.palette import voc_palette

SEQUENCES = {"disc-square": 5, "crossing": 6}
HW = (72, 136)


def _frame(rng: np.random.Generator, t: int, seq_i: int) -> tuple[np.ndarray, np.ndarray]:
    h, w = HW
    yy, xx = np.mgrid[0:h, 0:w]
    base = (40 + 60 * np.sin(xx / (7.0 + seq_i)) ** 2 + 50 * np.cos(yy / 5.0) ** 2)[..., None]
    img = np.clip(base + rng.normal(0, 6, (h, w, 3)) + np.array([10, 30, 50]), 0, 255)
    mask = np.zeros((h, w), np.uint8)
    cy, cx = 24 + 3 * seq_i, 20 + 9 * t
    disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (11 + seq_i) ** 2
    top, left = 30 + 5 * t, 70 - 4 * t * seq_i
    square = (yy >= top) & (yy < top + 18) & (xx >= left) & (xx < left + 22)
    img[disc] = [220, 40, 40] + rng.normal(0, 8, (int(disc.sum()), 3))
    img[square] = [40, 60, 210] + rng.normal(0, 8, (int(square.sum()), 3))
    mask[disc], mask[square] = 1, 2
    return np.clip(img, 0, 255).astype(np.uint8), mask


def write_davis(root: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    root, rng, out = Path(root), np.random.default_rng(seed), {}
    for i, (seq, n) in enumerate(SEQUENCES.items()):
        frames, masks = [], []
        for t in range(n):
            img, mask = _frame(rng, t, i)
            if t == 2:  # void pixels (255) on the disc's border: the tool counts them as background
                ring = (mask == 1) & (np.roll(mask, 2, axis=1) != 1)
                mask[ring] = 255
            for sub, arr, ext in (("JPEGImages", img, "jpg"), ("Annotations", mask, "png")):
                path = root / sub / "480p" / seq / f"{t:05d}.{ext}"
                path.parent.mkdir(parents=True, exist_ok=True)
                if ext == "jpg":
                    Image.fromarray(arr).save(path, quality=90)
                else:
                    im = Image.fromarray(arr, mode="P")
                    im.putpalette(voc_palette())
                    im.save(path)
            frames.append(img)
            masks.append(mask)
        out[seq] = (np.stack(frames), np.stack(masks))
    (root / "ImageSets" / "2017").mkdir(parents=True, exist_ok=True)
    (root / "ImageSets" / "2017" / "val.txt").write_text("".join(f"{s}\n" for s in SEQUENCES))
    return out
