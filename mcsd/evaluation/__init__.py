"""Downstream evaluation through lm-evaluation-harness."""
