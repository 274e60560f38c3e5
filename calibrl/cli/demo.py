"""calibrl demo (being written)."""
