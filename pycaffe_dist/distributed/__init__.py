"""Distributed training. A folder per kind of job, each with its coordinating side (master.py) and its workers:
data_parallel/ (the modes' rules in data_parallel/modes/), sandblaster/ and pipeline/. Beside them what every kind
shares: the lifecycles (coordinator.py on the coordinating side, job_process.py on the workers'), the job's spec
(job.py), the store (store.py over redis_client.py, its messages checked by wire.py), the one-machine launcher
(launch.py), status, the tester, and the transports (links.py, blob_exchange.py)."""
