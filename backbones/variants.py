"""Variant names: one attention normaliser and one global-token strategy, written ``norm+strategy``.

The paper's variants: ``softmax`` (plain CLS baseline), ``entmax``, ``registers``, ``specialization``,
``lastvit``; combinations such as ``entmax+lastvit``. Components may come in any order; the canonical
name puts the normaliser first and drops the defaults (softmax, cls).
"""
from __future__ import annotations

from dataclasses import dataclass

# variant word -> normaliser name used by backbones.normalizers
NORMALIZER_WORDS = {"softmax": "softmax", "entmax": "entmax15", "entmax15": "entmax15",
                    "sparsemax": "sparsemax", "entmax_bisect": "entmax_bisect"}
STRATEGIES = ("cls", "registers", "specialization", "lastvit")
_CANON_NORM = ("softmax", "entmax", "sparsemax", "entmax_bisect")

VARIANTS: tuple[str, ...] = tuple(
    list(_CANON_NORM) + list(STRATEGIES[1:])
    + [f"{n}+{s}" for n in _CANON_NORM[1:] for s in STRATEGIES[1:]])


@dataclass(frozen=True)
class VariantSpec:
    name: str          # canonical name
    normalizer: str    # softmax | entmax15 | sparsemax | entmax_bisect
    strategy: str      # cls | registers | specialization | lastvit


def parse_variant(name: str) -> VariantSpec:
    words = [w.strip().lower() for w in str(name).split("+") if w.strip()]
    norms = [w for w in words if w in NORMALIZER_WORDS]
    strategies = [w for w in words if w in STRATEGIES]
    if not words or len(norms) > 1 or len(strategies) > 1 or len(norms) + len(strategies) != len(words):
        raise ValueError(f"unknown variant '{name}'. Valid variants: {', '.join(VARIANTS)} "
                         f"(one normaliser of {', '.join(_CANON_NORM)} and/or one strategy of "
                         f"{', '.join(STRATEGIES[1:])}, joined by '+')")
    normalizer = NORMALIZER_WORDS[norms[0]] if norms else "softmax"
    strategy = strategies[0] if strategies else "cls"
    norm_word = {"entmax15": "entmax"}.get(normalizer, normalizer)
    parts = [] if normalizer == "softmax" else [norm_word]
    parts += [] if strategy == "cls" else [strategy]
    return VariantSpec("+".join(parts) or "softmax", normalizer, strategy)
