"""Figures: the paper's plots from benchmark results and training logs."""
