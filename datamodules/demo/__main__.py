"""``python -m datamodules.demo [--root R] [--force]`` (make demo-data)."""
import sys

from .cache import main

sys.exit(main())
