"""The PASCAL VOC colour map, without torch: the VOC loaders and the demo generator's workers both use it."""
from __future__ import annotations


def voc_palette() -> list[int]:
    """The PASCAL VOC colour map (256 entries; bit-interleaved label bits, as the devkit's VOClabelcolormap.m)."""
    pal = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal += [r, g, b]
    return pal
