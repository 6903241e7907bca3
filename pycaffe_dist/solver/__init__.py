"""Solvers: the training loop (solver.py), Caffe's update rules as functions of arrays (updates.py), the
learning-rate policies (lr_policy.py), snapshot files (snapshot.py) and Caffe-format training logs
(training_log.py)."""
