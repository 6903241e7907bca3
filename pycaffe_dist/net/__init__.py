"""The net: the layer graph built once from a NetParameter and a NetState, then only run (net.py), with the
graph's helpers (Split insertion, state rules), its per-layer timing, table and debug logs."""
