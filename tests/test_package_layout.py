"""The package's layout, read from its source with `ast` (nothing is imported):

- imports only go down the floors of ../shared/DESIGN.md (as the code has them: the backend below the blob,
  see FLOORS), and no import circle exists but the recurrent layers' inner Net;
- no module reads another module's private names (`x._name` where `_name` is not its own);
- every Redis call is made in distributed/store.py;
- every distributed mode option is declared once, in its mode module;
- nothing reads data from beside the checkout (the tests' data is in tests/fixtures).
"""
import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "pycaffe_dist"
GENERATED = {"proto/caffe_pb2.py"}

# Bottom up; a module may import from its own floor and the floors below it. The backend (devices, kernels) sits
# below the blob because a blob's SyncedMemory holds a device copy, as Caffe's SyncedMemory calls CUDA.
FLOORS = [
    {"errors", "proto", "common", "random_stream", "libm", "_kernels"},
    {"backend"},
    {"blob"},
    {"data"},
    {"layers"},
    {"net"},
    {"io"},
    {"export"},
    {"solver"},
    {"distributed"},
    {"metrics"},
    {"pycaffe", "net_spec", "coord_map", "draw", "classifier", "detector", "inference", "cli", "__init__",
     "__main__"},
]
# Caffe's RecurrentLayer builds an inner Net of layers: the one import that runs up, and the one circle.
ALLOWED_UP = {("layers.recurrent", "net.net")}


def modules():
    """{dotted name under pycaffe_dist ('net.net', 'layers' for layers/__init__.py): path}."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.as_posix() in GENERATED:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = modules()


def is_package(name):
    return MODULES[name].name == "__init__.py"


def resolve(name, node):
    """The package modules an import statement in module `name` names."""
    if isinstance(node, ast.Import):
        return [a.name[len("pycaffe_dist."):] for a in node.names if a.name.startswith("pycaffe_dist.")]
    if node.level == 0:
        if not (node.module or "").startswith("pycaffe_dist"):
            return []
        base = node.module[len("pycaffe_dist."):].split(".") if node.module != "pycaffe_dist" else []
    else:
        here = name.split(".") if name != "__init__" else []
        package = here if name in MODULES and is_package(name) else here[:-1]
        base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    found = []
    for alias in node.names:
        candidate = ".".join(base + [alias.name])
        if candidate in MODULES:
            found.append(candidate)
        elif base:
            found.append(".".join(base))
        else:
            found.append("__init__")
    return [f for f in found if f in MODULES]


def imports():
    """{(importer, imported)} over every import statement, at module level or inside functions."""
    edges = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update((name, target) for target in resolve(name, node) if target != name)
    return edges


def floor(name):
    top = name.split(".")[0]
    for level, names in enumerate(FLOORS):
        if top in names:
            return level
    raise AssertionError("pycaffe_dist/%s is on no floor: add its package to FLOORS" % name.replace(".", "/"))


def test_the_floors_name_every_package():
    for name in MODULES:
        floor(name)


def test_imports_only_go_down():
    up = sorted((a, b) for a, b in imports() if floor(b) > floor(a) and (a, b) not in ALLOWED_UP)
    assert not up, "imports that run up the floors: " + "; ".join("%s -> %s" % e for e in up)


def test_no_circles_but_the_recurrent_layers_net():
    graph = {}
    for a, b in imports():
        graph.setdefault(a, set()).add(b)
    circles = []
    for a, b in imports():
        # a -> b closes a circle when b reaches a again.
        seen, todo = set(), [b]
        while todo:
            current = todo.pop()
            if current == a:
                circles.append((a, b))
                break
            if current not in seen:
                seen.add(current)
                todo.extend(graph.get(current, ()))
    allowed = {"layers", "layers.recurrent", "net.net"}
    bad = sorted(e for e in circles if not set(e) <= allowed)
    assert not bad, "imports in a circle: " + "; ".join("%s -> %s" % e for e in bad)


def test_the_layout_test_sees_imports():
    """The checks above would pass on a walker that found nothing: make sure it finds what is known to be there."""
    edges = imports()
    assert ("layers.recurrent", "net.net") in edges
    assert ("net.net", "layers") in edges
    assert any(a.startswith("solver") and b == "net.net" for a, b in edges)
    assert floor("backend.select") < floor("blob.blob") < floor("net.net") < floor("distributed.data_parallel.master")


def own_private_names(tree):
    """Private names a module defines: functions, classes, assignments, attributes it sets, __slots__."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)       # __slots__ entries, getattr/setattr by name
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_")}


def private_reads(source, label):
    tree = ast.parse(source, label)
    own = own_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr not in own:
                found.append("%s:%d .%s" % (label, node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and alias.name != "_kernels":
                    found.append("%s:%d imports %s" % (label, node.lineno, alias.name))
    return found


def test_no_module_reads_another_modules_private_names():
    found = [f for path in MODULES.values()
             for f in private_reads(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "private names read across modules:\n" + "\n".join(found)


def test_the_private_name_check_can_fail():
    source = "from .net import _hidden\n\ndef f(net, self):\n    self._mine = 1\n    return net._blob_list, net._mine\n"
    assert sorted(private_reads(source, "probe.py")) == ["probe.py:1 imports _hidden", "probe.py:5 ._blob_list"]


REDIS_COMMANDS = {"set", "get", "getrange", "strlen", "hset", "hget", "hgetall", "hincrby", "hsetnx", "hstrlen",
                  "incr", "delete", "lpush", "rpop", "brpop", "scan_iter", "exists", "ping", "pipeline", "expire",
                  "publish", "keys", "flushdb", "hdel", "llen", "lrange", "setnx"}


def test_every_redis_call_is_in_the_store():
    """Redis is reached through a client (`.control`, `.clients`, `redis.Redis`): only distributed/store.py may
    hold one, and distributed/redis_client.py, which makes them (the store's connections)."""
    found = []
    for name, path in MODULES.items():
        if name in ("distributed.store", "distributed.redis_client"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("control", "clients"):
                found.append("%s:%d .%s" % (path.relative_to(PACKAGE.parent), node.lineno, node.attr))
            if isinstance(node, ast.Attribute) and node.attr == "Redis" and isinstance(node.value, ast.Name) \
                    and node.value.id == "redis":
                found.append("%s:%d redis.Redis" % (path.relative_to(PACKAGE.parent), node.lineno))
    assert not found, "Redis reached outside distributed/store.py and redis_client.py:\n" + "\n".join(found)


def test_mode_options_are_declared_once():
    """Each option name appears as a declaration in one mode module only, and nowhere else spells a default."""
    from pycaffe_dist.distributed.data_parallel.modes import MODES
    declared = {}
    for mode, module in MODES.items():
        for option in module.OPTIONS:
            assert option.name not in declared or declared[option.name] is option, \
                "option %s declared by %s and by %s" % (option.name, declared[option.name], mode)
            declared[option.name] = option
    assert {"tau", "factor", "max_advance", "weedout", "moving_rate", "overlap"} <= set(declared)


TESTS = PACKAGE.parent / "tests"


def listed_exceptions():
    """The test files tests/README.md lists as testing across modules (a table row per file or pattern)."""
    import re
    text = (TESTS / "README.md").read_text()
    return re.findall(r"^\| `([^`]+\.py)`", text, re.M)


def follows_the_naming_rule(path, exceptions):
    """Whether tests/<package>/test_<module>[_<aspect>].py names a module of pycaffe_dist/<package> (see
    tests/README.md), or the file is one of the listed exceptions."""
    import fnmatch
    rel = path.relative_to(TESTS.parent).as_posix()
    if any(fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(path.name, pattern) for pattern in exceptions):
        return True
    stem = path.stem[len("test_"):]
    folder = path.parent.relative_to(TESTS).as_posix()
    modules = set(MODULES) | {name[:-len(".py")].replace("/", ".") for name in GENERATED}
    if folder == "gpu":
        if not stem.endswith("_gpu"):
            return False
        stem, names = stem[:-len("_gpu")], {name.split(".")[-1] for name in modules}
    else:
        prefix = "" if folder == "." else folder.replace("/", ".") + "."
        names = {name[len(prefix):].split(".")[0] for name in modules if name.startswith(prefix) and name != prefix}
    return any(stem == name or stem.startswith(name + "_") for name in names if name != "__init__")


def test_every_test_file_follows_the_naming_rule():
    exceptions = listed_exceptions()
    assert "tests/test_package_layout.py" in exceptions and "test_golden_*.py" in exceptions
    wrong = [p.relative_to(TESTS.parent).as_posix() for p in sorted(TESTS.rglob("test_*.py"))
             if not follows_the_naming_rule(p, exceptions)]
    assert not wrong, "test files named after no module (tests/README.md says how to name them): " + ", ".join(wrong)


def test_the_naming_rule_can_fail():
    exceptions = listed_exceptions()
    assert follows_the_naming_rule(TESTS / "layers" / "test_pool_shapes.py", exceptions)
    assert follows_the_naming_rule(TESTS / "gpu" / "test_conv_gpu.py", exceptions)
    assert not follows_the_naming_rule(TESTS / "layers" / "test_shaping.py", [])
    assert not follows_the_naming_rule(TESTS / "layers" / "test_poolish.py", exceptions)
    assert not follows_the_naming_rule(TESTS / "gpu" / "test_conv.py", exceptions)
    assert not follows_the_naming_rule(TESTS / "io" / "test_binaryproto.py", exceptions)


# What solver/solver.py offers the distributed side (its section "what the distributed modes use").
SOLVER_API = {"weights", "weight_names", "weight_shapes", "set_weights", "read_weights", "images_per_iteration",
              "step_from", "compute_gradients", "apply_gradients", "test_at", "snapshot_at", "restore", "history_sets",
              "set_position", "position", "train_net", "clear_history", "trust",
              # the all-reduce workers run Caffe's own loop, as Caffe's multi-GPU training does: step() with the
              # callbacks NCCL hooks (on_start, on_gradients), the iteration, the rate's scale, the last loss
              "step", "add_callback", "iteration_hooks", "set_action_function", "iter", "param", "net", "rate_scale",
              "smoothed_loss", "history", "current_step"}


def solver_uses(source, label):
    """`solver.x` / `self.solver.x` reads and writes in a module, x outside SOLVER_API."""
    found = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Attribute) and node.attr not in SOLVER_API:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "solver" or \
                    isinstance(owner, ast.Attribute) and owner.attr == "solver":
                found.append("%s:%d solver.%s" % (label, node.lineno, node.attr))
    return found


def test_the_distributed_side_uses_only_the_solvers_api():
    found = [f for name, path in MODULES.items() if name.startswith("distributed")
             for f in solver_uses(path.read_text(), name)]
    assert not found, "the distributed side reaches into the Solver:\n" + "\n".join(found)
    assert solver_uses("def f(solver):\n    solver.test_nets = 3\n    return solver.weights\n", "probe") == \
        ["probe:2 solver.test_nets"]


# What may name the folder beside the checkout: the GPU check unpacks the device kit from it, where there is one.
BESIDE = re.compile(r"""\.\./shared/(?!gpu-kit)|parent\s*/\s*["']shared["']|/\s*["']shared["']\s*/""")


def beside_the_checkout(text):
    return [line for line in text.splitlines() if BESIDE.search(line)]


def test_nothing_reads_data_from_beside_the_checkout():
    """The tests' data is in tests/fixtures: a plain clone runs the suite with nothing beside it."""
    root = PACKAGE.parent
    found = {}
    for folder in ("pycaffe_dist", "tests", "tools", "bench", ".ci"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".sh", ".yml", ".cfg") or path.name == "run":
                lines = beside_the_checkout(path.read_text(errors="replace"))
                if lines and path.resolve() != pathlib.Path(__file__).resolve():
                    found[str(path.relative_to(root))] = lines
    assert found == {}


def test_the_beside_check_can_fail():
    assert beside_the_checkout('GOLDEN = REPO.parent / "shared" / "golden"\nx = "../shared/zoo/a"\n') == [
        'GOLDEN = REPO.parent / "shared" / "golden"', 'x = "../shared/zoo/a"']
    assert beside_the_checkout('kit = "../shared/gpu-kit"') == []


def test_the_rule_view_is_true_to_the_master_and_rules_only_read_it():
    """Every member of modes.base.RuleView (what a mode's rule may read of the master) is the master's, with the
    same parameters; the rules use no other member of it, and reach the master no other way: what they want done
    they return as actions (the view cannot drift from what it describes, nor the rules call back)."""
    import inspect
    from pycaffe_dist.distributed.data_parallel.master import Master
    from pycaffe_dist.distributed.data_parallel.modes.base import RuleView
    members = {name for name, value in vars(RuleView).items() if callable(value) and not name.startswith("_")}
    assert members == {"slot", "typical_staleness", "momentum", "history"}
    for name in members:
        view = inspect.signature(getattr(RuleView, name))
        real = inspect.signature(getattr(Master, name))
        assert list(view.parameters) == list(real.parameters), (name, view, real)
    paths = sorted((PACKAGE / "distributed" / "data_parallel" / "modes").glob("*.py"))
    assert len(paths) >= 9                              # base and the eight modes: the check below sees them all
    for path in paths:
        text = path.read_text()
        assert "self.master" not in text, path.name
        used = set(re.findall(r"self\.view\.(\w+)", text))
        assert used <= members, (path.name, used - members)


def test_every_key_of_the_store_is_in_its_one_table():
    """store.py's table lists every key of a job with the methods that read and write it: each public method of
    the Store and of each protocol's namespace (a Store subclass in keys.py of its kind's folder) is named there,
    and no namespace speaks to Redis but through the Store's blobs and queues."""
    from pycaffe_dist.distributed import store
    from pycaffe_dist.distributed.allreduce.keys import AllreduceStore
    from pycaffe_dist.distributed.data_parallel.keys import DataParallelStore
    from pycaffe_dist.distributed.pipeline.keys import PipelineStore
    from pycaffe_dist.distributed.sandblaster.keys import SandblasterStore
    namespaces = (DataParallelStore, SandblasterStore, PipelineStore, AllreduceStore)
    assert sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.glob("distributed/*/keys.py")) == [
        "distributed/allreduce/keys.py", "distributed/data_parallel/keys.py", "distributed/pipeline/keys.py",
        "distributed/sandblaster/keys.py"]
    rows = store.__doc__.split("  key  ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    # the methods column: each row's last part after a run of spaces (the rows without one end in what they hold)
    table = {word for row in rows if row.strip() for word in re.findall(r"[a-z_]+", re.split(r"\s{2,}", row)[-1])}
    assert {"publish_job", "put_activations", "hand_out"} <= table and not {"hash", "spec", "blobs"} & table
    # a key's name, the refusals, INFO, where a blob set's floats lie on the servers
    not_keys = {"key", "refuse", "servers_cpu_s", "servers_net_bytes", "layout"}
    for cls in (store.Store,) + namespaces:
        assert cls is store.Store or cls.__bases__ == (store.Store,), cls
        methods = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")} - not_keys
        assert methods and methods <= table, (cls.__name__, sorted(methods - table))
        assert cls.__name__ in store.__doc__ or cls is store.Store
    for path in PACKAGE.glob("distributed/*/keys.py"):
        assert "_control" not in path.read_text() and "_clients" not in path.read_text(), path


KINDS = ("data_parallel", "sandblaster", "pipeline", "allreduce")


def test_each_kind_of_job_has_its_folder_over_the_shared_lifecycles():
    """distributed/ holds a folder per kind of job, each with its coordinating side (master.py, a Coordinator), its
    workers' side (a JobProcess) and its protocol's keys (keys.py); no kind imports another, and the shared modules
    beside them import no kind (a new kind fits beside them without copying)."""
    import importlib
    import inspect
    from pycaffe_dist.distributed.coordinator import Coordinator
    from pycaffe_dist.distributed.job_process import JobProcess
    sides = {"data_parallel": "worker", "sandblaster": "worker", "pipeline": "stage", "allreduce": "worker"}
    for kind in KINDS:
        folder = PACKAGE / "distributed" / kind
        assert {"__init__.py", "master.py", "keys.py", sides[kind] + ".py"} <= {p.name for p in folder.glob("*.py")}
        master = importlib.import_module("pycaffe_dist.distributed.%s.master" % kind)
        worker = importlib.import_module("pycaffe_dist.distributed.%s.%s" % (kind, sides[kind]))
        assert [c for c in vars(master).values() if inspect.isclass(c) and issubclass(c, Coordinator)
                and c is not Coordinator and c.__module__ == master.__name__]
        assert [c for c in vars(worker).values() if inspect.isclass(c) and issubclass(c, JobProcess)
                and c is not JobProcess and c.__module__ == worker.__name__]
    for importer, imported in imports():
        if not importer.startswith("distributed.") or not imported.startswith("distributed."):
            continue
        own, other = importer.split(".")[1], imported.split(".")[1]
        if other in KINDS:
            assert own == other, "%s imports %s: the kinds of job stand side by side" % (importer, imported)


def test_the_version_has_one_place():
    """pycaffe_dist.__version__ is the version: the package's metadata (pyproject.toml reads it) and
    `dist_caffe --version` say the same."""
    import subprocess
    import sys
    from importlib import metadata
    import pycaffe_dist
    assert 'version = "' not in (PACKAGE.parent / "pyproject.toml").read_text()
    assert metadata.version("pycaffe-dist") == pycaffe_dist.__version__
    shown = subprocess.run([sys.executable, "-m", "pycaffe_dist", "--version"], capture_output=True, text=True)
    assert shown.stdout.strip() == "dist_caffe (pycaffe-dist) %s" % pycaffe_dist.__version__
