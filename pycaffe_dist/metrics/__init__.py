"""Live metrics of training: what a run's log lines and progress line say, for tools that watch runs.

record.py: the progress record every figure comes from (a distributed master's, on Redis; a one-process run's, from
its solver); tensorboard.py: `train --tensorboard DIR`, event files through tensorboardX; prometheus.py:
`--metrics-port P`, the record served to Prometheus; log_csv.py: `plot --csv`, Caffe's parse_log.py tables of a
log; flags.py: the command line's flags for them and what they open for a run."""
