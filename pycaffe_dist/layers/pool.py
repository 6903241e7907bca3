"""Pooling and SPP."""
