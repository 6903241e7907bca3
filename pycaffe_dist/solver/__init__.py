"""Solvers: the training loop (solver.py), Caffe's update rules as functions of arrays (updates.py), the
learning-rate policies (lr_policy.py) and Caffe-format training logs (training_log.py). Snapshot files are
read and written by io/caffemodel.py and io/solverstate.py."""
