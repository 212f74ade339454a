"""Shared plumbing for tokenmix: run paths, atomic file writes, safe checkpoint loading, mmseg shim."""
