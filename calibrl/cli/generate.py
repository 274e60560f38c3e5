"""calibrl generate (being written)."""
