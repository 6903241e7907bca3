"""LRN, MVN and BatchNorm."""
