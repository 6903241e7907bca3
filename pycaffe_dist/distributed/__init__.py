"""Distributed training: a master and workers that meet at a Redis parameter store (store), the merge rules of
SpeeDO's modes (modes/), the processes (master, worker) and the one-machine launcher (launch)."""
