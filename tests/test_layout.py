"""The package's shape: no import cycle between its modules, no module (nor benchmark) over
450 lines.

Imports are read from the source (ast), not executed. A module-level import
runs when its module is imported; one inside a function runs when the function
is called, which is how modules defer heavy imports (TensorFlow, JAX). Neither
kind may close a cycle between files.
"""

import ast
import configparser
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "keras_moe"
MAX_LINES = 450


def mapped_folders(root=ROOT):
    """{dotted package: folder} of setup.cfg's `package_dir`, and the packages it lists."""
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    if not config.has_section("options"):  # a made-up package of the tests below
        return {}, []
    options = config["options"]
    mapped = {}
    for line in options.get("package_dir", "").strip().splitlines():
        package, folder = (part.strip() for part in line.split("="))
        mapped[package] = root / folder
    return mapped, options["packages"].split()


def package_modules(root=ROOT, package=PACKAGE):
    """{dotted module name: path} of every .py file of `package`, including the
    folders setup.cfg's `package_dir` maps into it (tasks/ is `keras_moe.tasks`)."""
    out = {}
    mapped, _ = mapped_folders(root)
    bases = [((package,), root / package)]
    bases += [(tuple(name.split(".")), folder) for name, folder in mapped.items()]
    for prefix, base in bases:
        for folder, subfolders, files in os.walk(base):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            for file in sorted(f for f in files if f.endswith(".py")):
                path = pathlib.Path(folder) / file
                parts = prefix + path.relative_to(base).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def test_setup_cfg_lists_every_package_folder():
    """A package folder missing from setup.cfg's explicit list would be left out of
    the wheel (and of a non-editable install) without any error."""
    mapped, listed = mapped_folders()
    found = {
        ".".join((PACKAGE,) + p.parent.relative_to(ROOT / PACKAGE).parts)
        for p in (ROOT / PACKAGE).rglob("__init__.py")
    }
    found |= set(mapped)
    assert set(listed) == found
    assert not [p for p in (ROOT / PACKAGE).iterdir() if p.is_symlink()]


def imported_modules(name, path, modules, deferred):
    """The package modules that module `name` imports at module level (`deferred=False`)
    or inside functions (`deferred=True`). `from a import b` counts as an import of
    `a.b` when that is a module, else of `a`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    found = set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if is_type_checking_block(child):  # read by type checkers only, never run
                continue
            inside = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import) and inside == deferred:
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and inside == deferred:
                source = child.module or ""
                if child.level:
                    parts = name.split(".")[: len(name.split(".")) + is_package - child.level]
                    source = ".".join(parts + ([child.module] if child.module else []))
                for alias in child.names:
                    member = f"{source}.{alias.name}"
                    found.add(member if member in modules else source)
            visit(child, inside)

    visit(tree, False)
    out = set()
    for target in found:
        while target and target not in modules:  # keras_moe.x.Name -> keras_moe.x
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    if not deferred:
        out |= {package for target in out for package in enclosing_packages(target, name)}
    return out


def enclosing_packages(target, importer):
    """The packages whose __init__ importing `target` runs first, unless `importer` is
    inside them already: `keras_moe.models.x` from `keras_moe.gin_config` runs
    `keras_moe.models` (the package root runs before any of its modules)."""
    parts = target.split(".")
    packages = [".".join(parts[:i]) for i in range(2, len(parts))]
    return {p for p in packages if not (importer + ".").startswith(p + ".")}


def is_type_checking_block(node):
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(deferred=False):
    """{module: modules it imports}; with `deferred`, imports inside functions too."""
    modules = package_modules()
    graph = {name: imported_modules(name, path, modules, False) for name, path in modules.items()}
    if deferred:
        for name, path in modules.items():
            graph[name] |= imported_modules(name, path, modules, True)
    return graph


def cyclic_groups(graph):
    """Strongly connected groups of more than one module (Tarjan), as sets."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def one_cycle(graph, group):
    """A shortest import path from the group's first module back to itself, for messages."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for target in sorted(graph[path[-1]] & group):
            if target == start:
                return " -> ".join(path + [start])
            if target not in seen:
                seen.add(target)
                paths.append(path + [target])
    return " <-> ".join(sorted(group))


def test_cycle_helpers_find_a_cycle_and_accept_a_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cyclic_groups(graph) == [{"a", "b", "c"}]
    assert one_cycle(graph, {"a", "b", "c"}) == "a -> b -> c -> a"
    assert cyclic_groups({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_at_module_level_and_in_functions_separately(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("__init__", "a", "b", "sub/__init__", "sub/c"):
        (tmp_path / "pkg" / f"{name}.py").write_text("")
    source = (
        "import os\nfrom pkg import b\nfrom ..sub import c\nfrom pkg.sub.c import Name\n"
        "def f():\n    from pkg import a\n"
        "if TYPE_CHECKING:\n    from pkg import e\n"
    )
    path = tmp_path / "pkg" / "sub" / "d.py"
    path.write_text(source)
    modules = package_modules(tmp_path, "pkg")
    assert "pkg.sub.d" in modules and "pkg.sub" in modules
    assert imported_modules("pkg.sub.d", path, modules, False) == {"pkg.b", "pkg.sub.c"}
    # From outside pkg.sub, importing pkg.sub.c runs pkg.sub's __init__ first.
    (tmp_path / "pkg" / "e.py").write_text("from pkg.sub.c import Name\n")
    assert imported_modules("pkg.e", tmp_path / "pkg" / "e.py", modules, False) == {
        "pkg.sub.c",
        "pkg.sub",
    }
    assert imported_modules("pkg.sub.d", path, modules, True) == {"pkg.a"}


def test_the_graph_covers_the_package():
    graph = import_graph()
    assert {
        "keras_moe",
        "keras_moe.dispatch",
        "keras_moe.training.checkpoint",
        "keras_moe.tasks.registry",
    } <= set(graph)
    assert "keras_moe.dispatch.einsum" in graph["keras_moe.dispatch"]
    assert (
        "keras_moe.training.checkpoint.checkpoint_manager" in graph["keras_moe.training.checkpoint"]
    )


def test_no_import_cycle_at_module_level():
    graph = import_graph()
    cycles = [one_cycle(graph, group) for group in cyclic_groups(graph)]
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def test_no_import_cycle_through_imports_inside_functions():
    graph = import_graph(deferred=True)
    cycles = [one_cycle(graph, group) for group in cyclic_groups(graph)]
    assert not cycles, "import cycles through imports inside functions:\n" + "\n".join(cycles)


def files_over_the_line_limit(paths, limit=MAX_LINES):
    """{path relative to the repository: lines} of the files longer than `limit` lines."""
    out = {}
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out[str(path.relative_to(ROOT))] = lines
    return out


def test_the_line_count_reads_every_line():
    short, long = ROOT / "setup.cfg", ROOT / "README.md"
    lines = len(long.read_text(encoding="utf-8").splitlines())
    assert files_over_the_line_limit([short, long], limit=lines - 1) == {"README.md": lines}
    assert files_over_the_line_limit([short, long], limit=lines) == {}


def test_no_module_or_benchmark_exceeds_the_line_limit():
    paths = list(package_modules().values()) + sorted((ROOT / "benchmarks").glob("*.py"))
    too_long = files_over_the_line_limit(paths)
    assert not too_long, f"files over {MAX_LINES} lines (split them by concern): {too_long}"


def wing(module):
    """The top-level unit of a module: its folder under the package (`keras_moe.layers`
    for `keras_moe.layers.moe`), or the module itself for a file at the top."""
    return ".".join(module.split(".")[:2])


def wing_graph(graph):
    """{wing: wings it imports}, from the module graph (imports inside a wing dropped)."""
    out = {wing(name): set() for name in graph}
    for name, targets in graph.items():
        out[wing(name)] |= {wing(t) for t in targets} - {wing(name)}
    return out


def test_wings_follow_their_members():
    graph = {"p.a.x": {"p.b.y", "p.a.z"}, "p.a.z": set(), "p.b.y": {"p.c"}, "p.c": set()}
    assert wing_graph(graph) == {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set()}
    assert cyclic_groups(wing_graph({"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set()}))


def test_no_import_runs_back_up_between_folders():
    """The folders (and the files at the top) stand in floors: none imports one that
    imports it back, even through imports inside functions. The package root is left
    out: it is the door that imports every wing."""
    graph = import_graph(deferred=True)
    wings = wing_graph({k: v - {PACKAGE} for k, v in graph.items() if k != PACKAGE})
    cycles = [one_cycle(wings, group) for group in cyclic_groups(wings)]
    assert not cycles, "folders that import each other:\n" + "\n".join(cycles)


# The files at the package's top: its root, the allowed argument values and the
# shared helpers every wing may use. A new module goes into the wing it serves.
TOP_LEVEL_FILES = {
    "__init__.py",
    "arguments.py",
    "compat.py",
    "log_filters.py",
    "mixin_bases.py",
    "startup.py",
    "tensor_types.py",
    "validation.py",
}


def test_the_top_level_holds_only_the_shared_helpers():
    found = {p.name for p in (ROOT / PACKAGE).glob("*.py")}
    assert found <= TOP_LEVEL_FILES, f"put these in a folder: {sorted(found - TOP_LEVEL_FILES)}"
