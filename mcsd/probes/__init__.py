"""Probes of trained models: what they use of their context."""
