"""One cell of a planned study, for job scripts: record its marker after the cell's command succeeded
(``python -m study.record --plan <plan.json> --cell knn.entmax.seed0 --record``). Exit status 1 (and no marker)
when the cell left nothing to record: no checkpoint, or no results.json computed from that checkpoint.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenmix.cli import error_exit

from .store import read_plan, record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m study.record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="plan.json written by `make study`")
    p.add_argument("--cell", required=True, help="cell id, e.g. pretrain.entmax.seed0 or knn.entmax.seed0")
    p.add_argument("--record", action="store_true", help="write the cell's marker (the only action)")
    args = p.parse_args(argv)
    cells = read_plan(Path(args.plan))
    cell = next((c for c in cells if c.id == args.cell), None)
    if cell is None or not args.record:
        return error_exit(f"no cell {args.cell!r} in {args.plan}; cells: {', '.join(c.id for c in cells)}"
                          if cell is None else "nothing to do: pass --record", 2)
    try:
        rec = record(cell)
    except FileNotFoundError as e:
        return error_exit(e, 1)
    print(f"[study] recorded {cell.id}: {rec.get('results') or rec['checkpoint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
