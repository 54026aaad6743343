"""Networks and their checkpoint formats."""
