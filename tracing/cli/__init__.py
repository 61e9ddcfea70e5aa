"""The phasetrace command line."""
