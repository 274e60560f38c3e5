"""calibrl train (being written)."""
