"""Sandblaster L-BFGS (DistBelief): the master runs the optimizer on whole-data-set evaluations that its workers
compute in work units (master.py: the coordinating side; worker.py: the workers)."""
