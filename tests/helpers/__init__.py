"""Helpers the tests share (importable as ``helpers``: pytest puts tests/ on sys.path)."""
