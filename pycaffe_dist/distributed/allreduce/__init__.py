"""All-reduce data parallelism (`--mode allreduce`): every worker holds the solver, and each iteration's gradients
are averaged over MPI with no master on the data path (master.py, worker.py, keys.py; ring.py, buckets.py)."""
