"""Pipeline model parallelism: the net cut into stages, one process each, micro-batches flowing forward and their
gradients back (master.py: the coordinating side; stage.py: a stage)."""
