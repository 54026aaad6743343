"""Kinds of target (contracts.Target): causal.py, a Hugging Face causal LM with a KV cache."""
