"""calibrl eval (being written)."""
