"""Data-parallel training: every worker holds the whole net and trains it on its own shard of the data; the master
merges their results into the global weights W by its mode's rule (modes/), and serves W back. master.py is the
coordinating side, worker.py the workers' rounds; results.py, broadcast.py and compression.py move results and W;
the learning rate of N workers is the shared lr_scaling.py's."""
