"""Solvers: the training loop, the update rules and the learning-rate policies."""
