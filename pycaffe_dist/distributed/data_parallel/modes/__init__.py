"""The distributed modes: for each, its options, the master's merge and scheduling rule and the worker's push/pull
rule, side by side in one module (base.py says what a mode module holds). `MODES` maps the command-line name to
the module; `resolve_options` checks a job's options against the mode's declarations and fills in defaults."""
from ....errors import PycaffeDistError
from . import async_, easgd, gossip, gradient_only, local_sgd, ssp, sync, weedout

MODES = {"sync": sync, "async": async_, "partial-sync": ssp, "weed-out": weedout, "easgd": easgd,
         "gradient-only": gradient_only, "gossip": gossip}
MODES["local-sgd"] = local_sgd


def all_options():
    """Every mode option once, in the order the modes declare them (for the command line)."""
    seen = {}
    for module in MODES.values():
        for option in module.OPTIONS:
            seen.setdefault(option.name, option)
    return list(seen.values())


def modes_using(option):
    return [name for name, module in MODES.items() if option in module.OPTIONS]


def default_of(mode, option):
    """The option's default in `mode`: its declaration's, unless the mode has its own (base.py: DEFAULTS)."""
    return getattr(MODES[mode], "DEFAULTS", {}).get(option.name, option.default)


def resolve_options(mode, given):
    """The options of `mode`: those `given` (name -> value; None: not given) checked, the others at their
    defaults. An option of another mode given with a value other than its default is an error (it would be
    ignored)."""
    if mode not in MODES:
        raise PycaffeDistError("unknown mode %r (use %s)" % (mode, ", ".join(MODES)))
    declared = {option.name: option for option in MODES[mode].OPTIONS}
    resolved = {}
    for option in all_options():
        value = given.get(option.name)
        if option.name not in declared:
            if value is not None and value != option.default:
                raise PycaffeDistError("%s is not an option of mode %s (it is of %s; %s takes %s)" % (
                    option.flag, mode, ", ".join(modes_using(option)), mode,
                    ", ".join(o.flag for o in MODES[mode].OPTIONS) or "no options"))
            continue
        if value is None:
            value = default_of(mode, option)
        elif option.type is not bool:
            value = option.type(value)
        problem = option.check(value) if option.check is not None and value is not None else None
        if problem:
            raise PycaffeDistError("%s %s (%s)" % (option.flag, problem, option.help))
        resolved[option.name] = value
    unknown = sorted(set(given) - {o.name for o in all_options()})
    if unknown:
        raise PycaffeDistError("unknown mode option(s): %s" % ", ".join(unknown))
    return resolved
