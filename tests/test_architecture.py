"""The import graph of the package: dependencies point one way, no cycles, the hot path imports nothing
above it. Read from the source (every import statement, also those inside functions), so a lazy
import counts as much as a top-level one.

Tiers, bottom up (a module may import its own tier and those below):
  kernels               the policy kernel: nothing of control_node outside control_node.kernels
  errors, rundir,       leaves: formats, endpoint helpers and the /proc reader, standard library and numpy
  endpoints, procfs     only
  loop                  the hot path: loop itself, rundir, errors, kernels
  node level            config, security, sockets, node, report, recording, monitor, launch
  sim, train, bench,    tools: never imported by the node level (train may use sim's dynamics);
  bridge, live          rclpy (ROS 2) is imported only by the bridge and the ROS 2 simulator; foxglove
                        (the live view's server) only by live
  cli, verbs            the composition root: the only code that imports sim, train and bench
"""
from __future__ import annotations

import ast
import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOOLS = ("control_node.sim", "control_node.train", "control_node.bench", "control_node.bridge", "control_node.live")
ROOT_TIER = ("control_node.cli", "control_node.__main__", "control_node.verbs")
LEAVES = ("control_node.errors", "control_node.rundir", "control_node.endpoints", "control_node.procfs")
HOT = "control_node.loop"
REPORT = "control_node.report"
NODE_LEVEL = ("control_node.config", "control_node.configs", "control_node.deploy", "control_node.security",
              "control_node.sockets",
              "control_node.lifecycle", "control_node.metrics", "control_node.node", "control_node.recording",
              "control_node.diagnosis", "control_node.monitor", "control_node.launch")
# the module map, bottom up: every module is placed in exactly one tier (the package itself, whose
# docstring is the map, imports nothing)
TIERS = (("kernel", ("control_node.kernels",)), ("leaf", LEAVES), ("loop", (HOT,)), ("report", (REPORT,)),
         ("node level", NODE_LEVEL), ("tools", TOOLS), ("composition root", ROOT_TIER))


def tier_of(mod: str) -> str | None:
    """The tier ``mod`` belongs to, None when the map cannot place it."""
    if mod == "control_node":
        return "package"
    found = [name for name, prefixes in TIERS if _under(mod, prefixes)]
    return found[0] if len(found) == 1 else None


def _under(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in ((prefixes,) if isinstance(prefixes, str) else prefixes))


def package_dirs() -> dict:
    """Import name -> source folder, from pyproject.toml (what the wheel ships)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        st = tomllib.load(f)["tool"]["setuptools"]
    mapping = st.get("package-dir", {})
    out = {}
    for pkg in st["packages"]:
        # the nearest mapped parent decides the folder (setuptools' rule)
        parts = pkg.split(".")
        for i in range(len(parts), 0, -1):
            head = ".".join(parts[:i])
            if head in mapping:
                out[pkg] = os.path.join(ROOT, mapping[head], *parts[i:])
                break
        else:
            out[pkg] = os.path.join(ROOT, *parts)
    return out


def read_sources() -> dict:
    """Module name -> (path, source text) for every .py and .pyx the packages hold."""
    out = {}
    for pkg, d in package_dirs().items():
        for name in sorted(os.listdir(d)):
            stem, ext = os.path.splitext(name)
            if ext not in (".py", ".pyx"):
                continue
            mod = pkg if stem == "__init__" else f"{pkg}.{stem}"
            with open(os.path.join(d, name)) as f:
                out[mod] = (os.path.join(d, name), f.read())
    return out


PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+([\w, ]+)|c?import\s+([\w.]+))", re.M)


def imports_of(mod: str, path: str, text: str, known: set) -> set:
    """control_node modules that ``mod`` imports (resolving relative imports and `from pkg import sub`)."""
    is_pkg = os.path.basename(path).startswith("__init__.")
    pkg = mod if is_pkg else mod.rpartition(".")[0]
    found = set()

    def add(base, names=()):
        if not base.startswith("control_node"):
            return
        subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
        found.update(subs)
        if len(subs) < len(names) or not names:       # something imported from the module itself
            found.add(base)

    if path.endswith(".pyx"):
        for m in PYX_IMPORT.finditer(text):
            if m.group(1):
                add(m.group(1), [n.strip() for n in m.group(2).split(",")])
            else:
                add(m.group(3))
        return found - {mod}
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            add(base, [a.name for a in node.names])
    # importlib.import_module(f"control_node.verbs.{verb}") in cli.py: a dynamic edge to the verbs
    if "import_module(f\"control_node.verbs." in text:
        found.update(k for k in known if k.startswith("control_node.verbs."))
    return found - {mod}


def import_graph(sources: dict) -> dict:
    known = set(sources)
    return {mod: imports_of(mod, path, text, known) for mod, (path, text) in sources.items()}


def violations(graph: dict) -> list[str]:
    """Every module the map cannot place, every edge that breaks the tiers, and every import cycle."""
    bad = [f"{mod} is in no tier: place it in TIERS (tests/test_architecture.py) and the map in "
           "control_node/__init__.py" for mod in sorted(graph) if tier_of(mod) is None]
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            why = None
            if _under(mod, "control_node.kernels") and not _under(dep, "control_node.kernels"):
                why = "the kernel imports nothing of control_node outside itself"
            elif _under(mod, LEAVES) and not _under(dep, LEAVES):
                why = "errors, rundir, endpoints and procfs are leaves"
            elif _under(mod, HOT) and not _under(dep, (HOT, "control_node.kernels", *LEAVES)):
                why = "the hot path imports only itself, the kernel, rundir and errors"
            elif _under(mod, REPORT) and not _under(dep, (REPORT, *LEAVES)):
                why = "the report reads runs through rundir only"
            elif _under(dep, TOOLS) and not _under(mod, (*TOOLS, *ROOT_TIER)):
                why = "only the CLI (verbs) imports sim, train and bench"
            elif _under(dep, ROOT_TIER) and not _under(mod, ROOT_TIER):
                why = "nothing imports the CLI"
            elif _under(mod, ("control_node.sim", "control_node.train")) and _under(dep, "control_node.bench"):
                why = "sim and train do not import bench"
            elif _under(mod, "control_node.sim") and _under(dep, "control_node.train"):
                why = "sim does not import train (train may use sim's dynamics)"
            if why:
                bad.append(f"{mod} imports {dep}: {why}")
    bad += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return bad


def cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_follows_the_tiers():
    graph = import_graph(read_sources())
    assert "control_node.loop._rtloop" in graph and "control_node.kernels._policy" in graph
    assert "control_node.kernels" in graph["control_node.loop._rtloop"] or \
        "control_node.kernels._policy" in graph["control_node.loop._rtloop"]      # the .pyx was read
    assert violations(graph) == []


def test_a_hot_path_module_importing_the_report_fails_the_check():
    sources = read_sources()
    sources["control_node.loop.bad"] = ("control_node/loop/bad.py",
                                        "def f():\n    from control_node.report import generate\n")
    bad = violations(import_graph(sources))
    assert bad == ["control_node.loop.bad imports control_node.report: the hot path imports only itself, "
                   "the kernel, rundir and errors"], bad


def test_every_module_is_placed_and_an_unplaced_one_fails_the_check():
    sources = read_sources()
    assert {m: tier_of(m) for m in sources if tier_of(m) is None} == {}
    assert tier_of("control_node.procfs") == "leaf" and tier_of("control_node.diagnosis.doctor.registry") == \
        "node level"
    sources["control_node.newthing"] = ("control_node/newthing.py", "import os\n")
    bad = violations(import_graph(sources))
    assert bad == ["control_node.newthing is in no tier: place it in TIERS (tests/test_architecture.py) and the "
                   "map in control_node/__init__.py"], bad


def test_the_proc_reader_is_a_leaf():
    """control_node.procfs imports nothing of control_node: doctor, attribution and the loop's isolation
    all use it, so it sits below each of them."""
    sources = read_sources()
    graph = import_graph(sources)
    assert graph["control_node.procfs"] == set()
    users = {m for m, deps in graph.items() if "control_node.procfs" in deps}
    assert {"control_node.loop.isolation", "control_node.diagnosis.attribution",
            "control_node.diagnosis.doctor.context"} <= users
    path, text = sources["control_node.procfs"]
    sources["control_node.procfs"] = (path, text + "\nfrom control_node.config import load_config\n")
    bad = violations(import_graph(sources))
    assert "control_node.procfs imports control_node.config: errors, rundir, endpoints and procfs are leaves" in bad


def test_a_node_module_importing_the_simulator_fails_the_check():
    sources = read_sources()
    path, text = sources["control_node.monitor"]
    sources["control_node.monitor"] = (path, text + "\nfrom control_node.sim import engine\n")
    bad = violations(import_graph(sources))
    assert any(b.startswith("control_node.monitor imports control_node.sim") for b in bad), bad


def test_a_cycle_fails_the_check():
    sources = read_sources()
    path, text = sources["control_node.config"]
    sources["control_node.config"] = (path, text + "\nimport control_node.node\n")
    bad = violations(import_graph(sources))
    assert any(b.startswith("import cycle:") and "control_node.config" in b for b in bad), bad


def test_every_package_folder_is_in_the_wheel():
    """A folder with an __init__.py that pyproject.toml does not list would be missing from the wheel
    (the way control_node/verbs/ once was)."""
    dirs = package_dirs()
    listed = {os.path.realpath(d) for d in dirs.values()}
    for d in set(dirs.values()):
        for sub in os.listdir(d):
            full = os.path.join(d, sub)
            if os.path.isfile(os.path.join(full, "__init__.py")):
                assert os.path.realpath(full) in listed, f"{full} is a package but not in pyproject.toml"


ROS_PACKAGES = ("rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "trajectory_msgs", "builtin_interfaces")
ROS_TIER = ("control_node.bridge", "control_node.sim.pendulum_ros2", "control_node.sim.mujoco_ros2",
            "control_node.sim.ros2_spin", "control_node.bench.peers.ros2")


def ros_importers(sources: dict) -> set:
    """Modules with any import statement (top-level or inside a function) of rclpy or a ROS message package."""
    found = set()
    for mod, (path, text) in sources.items():
        if path.endswith(".pyx"):
            continue
        for node in ast.walk(ast.parse(text, path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ROS_PACKAGES for n in names):
                found.add(mod)
    # importlib.import_module(f"{pkg}.msg") reads a ROS message package dynamically
    found.update(m for m, (_, t) in sources.items() if 'import_module(f"{pkg}.msg")' in t)
    return found


def test_only_the_bridge_and_the_ros2_simulator_import_rclpy():
    importers = ros_importers(read_sources())
    assert "control_node.bridge.ros2" in importers          # the check sees the real importer
    outside = sorted(m for m in importers if not _under(m, ROS_TIER))
    assert outside == [], f"modules outside the bridge import ROS 2: {outside} (the node never imports rclpy)"
    graph = import_graph(read_sources())
    # nothing at the node level or below reaches the bridge, directly or through another module
    node_level = [m for m in graph if not _under(m, (*TOOLS, *ROOT_TIER))]
    for m in node_level:
        assert not any(_under(d, "control_node.bridge") for d in graph[m]), m


def test_a_node_module_importing_rclpy_fails_the_check():
    src = read_sources()
    src["control_node.node"] = (src["control_node.node"][0], src["control_node.node"][1] + "\nimport rclpy\n")
    assert "control_node.node" in ros_importers(src)


def test_only_the_live_view_imports_foxglove():
    """foxglove-sdk (an optional extra) is imported by control_node.live alone: never by the node."""
    found = set()
    for mod, (path, text) in read_sources().items():
        if path.endswith(".pyx"):
            continue
        for node in ast.walk(ast.parse(text, path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] == "foxglove" for n in names):
                found.add(mod)
    assert "control_node.live.server" in found                # the check sees the real importer
    assert sorted(m for m in found if not _under(m, "control_node.live")) == []
    graph = import_graph(read_sources())
    node_level = [m for m in graph if not _under(m, (*TOOLS, *ROOT_TIER))]
    for m in node_level:
        assert not any(_under(d, "control_node.live") for d in graph[m]), m


def test_the_package_docstring_names_every_top_level_module():
    """The module map (control_node/__init__.py's docstring) names each module and package of control_node
    and each mapped folder, so a new one cannot be added without placing it there too."""
    import control_node
    doc = control_node.__doc__
    missing = []
    for name in sorted(os.listdir(os.path.join(ROOT, "control_node"))):
        path = os.path.join(ROOT, "control_node", name)
        if name.startswith("_") or name == "configs":
            continue
        if name.endswith(".py"):
            want = f"``{name}``"
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            want = f"``{name}/``"
        else:
            continue
        if want not in doc:
            missing.append(want)
    for folder in package_dirs().values():
        rel = os.path.relpath(folder, ROOT)
        if "/" not in rel and not rel.startswith("control_node") and f"``{rel}/``" not in doc:
            missing.append(f"``{rel}/``")
    assert missing == [], f"control_node/__init__.py's module map does not name {missing}"
