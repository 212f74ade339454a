"""``python -m datamodules.demo [--root R] [--force] [--workers N]`` (make demo-data)."""
import sys

from .cache import main

sys.exit(main())
