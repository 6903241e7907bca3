"""Data sources, transforms and prefetching."""
