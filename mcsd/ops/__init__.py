"""Token-mixing ops."""
