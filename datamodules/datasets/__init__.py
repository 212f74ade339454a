"""The datasets in their on-disk layouts, one module each, and the bases they share (``base``: decoding, split
files, skip-corrupt; ``depth_base``; ``custom_base``; ``boxes``). The registry by name (``build_dataset``,
``DATASETS``) is ``datamodules/registry.py``, above both this package and the demo generator."""
