"""The distributed modes: for each, the master's merge and scheduling rule and the worker's push/pull rule, side by
side in one module. `MODES` maps the command-line name to the module."""
from . import async_, easgd, gradient_only, ssp, sync, weedout

MODES = {"sync": sync, "async": async_, "partial-sync": ssp, "weed-out": weedout, "easgd": easgd,
         "gradient-only": gradient_only}
