"""The built-in testbed."""
