"""Variant names: one attention normaliser and one global-token strategy, written ``norm+strategy`` in any order
(``entmax+lastvit``); the canonical name puts the normaliser first and drops the defaults (softmax, cls). Both
axes are str-valued enums, so YAML/CLI values compare equal to the plain names.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _StrEnum(str, Enum):
    """A str whose ``str()``/format is its value (``enum.StrEnum`` needs Python 3.11)."""
    __str__ = str.__str__
    __format__ = str.__format__


class Normalizer(_StrEnum):
    """Attention normaliser (``backbones.normalizers.build_normalizer``)."""
    SOFTMAX = "softmax"
    ENTMAX15 = "entmax15"
    SPARSEMAX = "sparsemax"
    ENTMAX_BISECT = "entmax_bisect"


class Strategy(_StrEnum):
    """Global-token strategy; what each one changes in the ViT: ``backbones.vit.STRATEGY_RULES``."""
    CLS = "cls"
    REGISTERS = "registers"
    SPECIALIZATION = "specialization"
    LASTVIT = "lastvit"


# variant word -> normaliser ("entmax" is the paper's name for entmax-1.5)
NORMALIZER_WORDS = {"softmax": Normalizer.SOFTMAX, "entmax": Normalizer.ENTMAX15, "entmax15": Normalizer.ENTMAX15,
                    "sparsemax": Normalizer.SPARSEMAX, "entmax_bisect": Normalizer.ENTMAX_BISECT}
STRATEGIES = tuple(s.value for s in Strategy)
_CANON_NORM = ("softmax", "entmax", "sparsemax", "entmax_bisect")
_NORM_WORD = {Normalizer.ENTMAX15: "entmax"}  # canonical variant word of a normaliser, where not its value

VARIANTS: tuple[str, ...] = tuple(
    list(_CANON_NORM) + list(STRATEGIES[1:])
    + [f"{n}+{s}" for n in _CANON_NORM[1:] for s in STRATEGIES[1:]])


@dataclass(frozen=True)
class VariantSpec:
    name: str                # canonical name
    normalizer: Normalizer
    strategy: Strategy


def parse_variant(name: str) -> VariantSpec:
    words = [w.strip().lower() for w in str(name).split("+") if w.strip()]
    norms = [w for w in words if w in NORMALIZER_WORDS]
    strategies = [w for w in words if w in STRATEGIES]
    if not words or len(norms) > 1 or len(strategies) > 1 or len(norms) + len(strategies) != len(words):
        raise ValueError(f"unknown variant '{name}'. Valid variants: {', '.join(VARIANTS)} "
                         f"(one normaliser of {', '.join(_CANON_NORM)} and/or one strategy of "
                         f"{', '.join(STRATEGIES[1:])}, joined by '+')")
    normalizer = NORMALIZER_WORDS[norms[0]] if norms else Normalizer.SOFTMAX
    strategy = Strategy(strategies[0]) if strategies else Strategy.CLS
    parts = [] if normalizer is Normalizer.SOFTMAX else [_NORM_WORD.get(normalizer, normalizer.value)]
    parts += [] if strategy is Strategy.CLS else [strategy.value]
    return VariantSpec("+".join(parts) or "softmax", normalizer, strategy)
