"""The package's layers import one way only (docs/architecture.md, "Layers").

Every import of every module under ``crossflow/`` — at module level and inside functions,
``import x`` and ``from x import y``, absolute and relative — is an edge from the module's
layer to the imported module's layer; an edge to a higher layer fails the test.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "crossflow"

#: The layers, lowest first: a module may import its own layer and the ones before it.
#: The key is the first component below ``crossflow`` (``crossflow.<key>...``);
#: ``crossflow.search.reports`` counts as ``reports``; the package root
#: (``crossflow/__init__.py``) is the public facade.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors/units", ("errors", "units", "outputs")),
    ("config", ("config",)),
    ("tech", ("tech",)),
    ("arch", ("arch",)),
    ("kernels", ("kernels",)),
    ("workloads", ("workloads",)),
    ("parallel", ("parallel",)),
    ("system", ("system",)),
    ("sim", ("sim",)),
    ("prediction facade", ("prediction", "predict", "distributed", "__init__")),
    # The measurement scripts shipped beside the measurements are tools too.
    ("tools", ("validation", "calibrate", "presets")),
    ("search", ("search",)),
    ("reports", ("reports",)),
    # the command line and its helpers (the preset catalogue, check of files and designs)
    ("cli", ("cli", "__main__", "catalogue", "checks")),
)
RANK = {key: rank for rank, (_, keys) in enumerate(LAYERS) for key in keys}
SEARCH = RANK["search"]


def layer_of(module: str) -> int | None:
    """The rank of ``module``'s layer; None outside the package."""
    parts = module.split(".")
    if parts[0] != "crossflow":
        return None
    if len(parts) == 1:
        return RANK["__init__"]
    key = parts[1]
    if key == "search" and len(parts) > 2 and parts[2] == "reports":
        key = "reports"
    if key not in RANK:
        raise AssertionError(f"{module} is in no layer: add crossflow.{key} to LAYERS")
    return RANK[key]


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, wherever it is."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from crossflow import units`` imports a module
                sub = f"{target}.{alias.name}"
                found.append((sub if _is_module(sub) else target, node.lineno))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_walker_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The import walker itself: function-local, relative and from-imports are edges."""
    pkg = tmp_path / "crossflow" / "kernels"
    pkg.mkdir(parents=True)
    (tmp_path / "crossflow" / "__init__.py").write_text("")
    (tmp_path / "crossflow" / "units.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "gemm.py").write_text("")
    probe = pkg / "probe.py"
    probe.write_text(
        "import crossflow.sim.engine\n"
        "from crossflow import units\n"
        "def f():\n"
        "    from ..search import study\n"
        "    from .gemm import x\n"
        "    import optuna\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imports(probe) == [("crossflow.sim.engine", 1), ("crossflow.units", 2),
                              ("crossflow.search", 4), ("crossflow.kernels.gemm", 5),
                              ("optuna", 6)]
    assert layer_of("crossflow.search.reports.pareto") == RANK["reports"]
    assert layer_of("crossflow.search.study") == SEARCH
    assert layer_of("crossflow") == RANK["predict"]
    assert layer_of("numpy") is None


def test_every_module_is_in_a_layer():
    for path in MODULES:
        layer_of(module_name(path))  # raises for a package the order does not know


def test_imports_go_down_the_layers():
    upward = []
    for path in MODULES:
        module = module_name(path)
        mine = layer_of(module)
        for target, line in imports(path):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {module} ({LAYERS[mine][0]}) "
                              f"imports {target} ({LAYERS[theirs][0]})")
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_no_optuna_or_mlflow_below_search():
    found = []
    for path in MODULES:
        module = module_name(path)
        if layer_of(module) >= SEARCH:
            continue
        for target, line in imports(path):
            if target.split(".")[0] in ("optuna", "mlflow"):
                found.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert not found, "\n".join(found)


#: The search package's own layers, lowest first (docs/architecture.md, "The search
#: package"): the key is the component below ``crossflow.search``; the package itself
#: (its lazy public facade) is above them all.
SEARCH_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("names", ("keys", "encoding", "knobs", "locations", "children", "trials")),
    ("problem", ("space", "objective", "lattice", "orders", "compass")),
    ("samplers", ("samplers",)),
    ("runtime", ("storage", "rdb", "rdb_sql", "reconnect", "storage_check", "journal", "workers",
                 "tracking", "_plots")),
    ("study", ("study",)),
    ("compare", ("compare", "compare_plot", "best_known", "best_known_phases")),
)
SEARCH_RANK = {key: rank for rank, (_, keys) in enumerate(SEARCH_LAYERS) for key in keys}
SEARCH_MODULES = [p for p in MODULES if module_name(p).startswith("crossflow.search")
                  and layer_of(module_name(p)) == SEARCH]


def search_layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 2:
        return len(SEARCH_LAYERS)  # the package's facade
    if parts[2] not in SEARCH_RANK:
        raise AssertionError(f"{module} is in no layer of the search package: add "
                             f"{parts[2]!r} to SEARCH_LAYERS")
    return SEARCH_RANK[parts[2]]


def _search_edges() -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every import between two modules of the search
    layer (function-local imports included)."""
    edges = []
    for path in SEARCH_MODULES:
        module = module_name(path)
        for target, line in imports(path):
            if target.startswith("crossflow.search") and layer_of(target) == SEARCH \
                    and target != module:
                edges.append((module, target, f"{path.relative_to(ROOT)}:{line}"))
    return edges


def test_the_search_package_imports_down_its_own_layers():
    """names < problem < samplers < runtime < study < compare: a sampler never reaches
    for the storage or the study runner, the runtime never for a sampler."""
    upward = [f"{where}: {a} ({SEARCH_LAYERS[search_layer_of(a)][0]}) imports {b} "
              f"({SEARCH_LAYERS[search_layer_of(b)][0]})"
              for a, b, where in _search_edges()
              if search_layer_of(b) < len(SEARCH_LAYERS)
              and search_layer_of(b) > search_layer_of(a)]
    assert not upward, "imports that go up the search package's layers:\n" + "\n".join(upward)


def test_the_search_package_has_no_import_loops():
    """No module of the search package reaches itself through its imports (a package's
    import of its own submodules aside, which is how it re-exports them)."""
    import networkx as nx

    graph = nx.DiGraph()
    for a, b, _ in _search_edges():
        if not b.startswith(a + "."):
            graph.add_edge(a, b)
    loops = list(nx.simple_cycles(graph))
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in loops)


# Spelled in pieces so that this file does not contain them.  The third is the development
# folder's copy of the papers and configs, which preset comments once cited.
FORBIDDEN = ("../" + "shared", "/work/" + "shared", "shared/" + "reference", "DESIGN" + ".md")


def _repo_files(suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != ".git"]
        found += [Path(folder, f) for f in files if Path(f).suffix in suffixes]
    return sorted(found)


@pytest.mark.parametrize("text", FORBIDDEN)
def test_nothing_points_outside_the_repository(text):
    """Users have neither the development folder beside the checkout nor the design notes:
    the code, docs and presets (their comments, measurement files' headers) cite
    docs/architecture.md, the publications and the packaged measurement files."""
    hits = [f"{p.relative_to(ROOT)}:{n}"
            for p in _repo_files((".py", ".md", ".yaml", ".yml", ".csv", ".toml", ".txt",
                                 ".json", ".sh"))
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace")
                                     .splitlines(), 1) if text in line]
    assert not hits, f"{text!r} in " + ", ".join(hits)


# --- the config layer's registry of kinds ------------------------------------------------

ABOVE_CONFIG = sorted(key for key, rank in RANK.items() if rank > RANK["config"]
                      and key != "__init__")


def test_the_config_layer_names_no_module_above_it():
    """Not even in a string: kinds defined above config register themselves (or are
    declared by the package root), the config layer does not list them."""
    pattern = re.compile(r"crossflow\.(" + "|".join(ABOVE_CONFIG) + r")\b")
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
            for p in sorted((PACKAGE / "config").rglob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_kinds_defined_above_config_load_through_their_entry_points():
    from crossflow.config import loader

    assert loader.ENTRY_POINTS["study"] == ("studies", "crossflow.search.study")
    spec = loader.load_spec(ROOT / "studies" / "quickstart.yaml")
    assert spec.kind == "study" and type(spec).__module__.startswith("crossflow.search.study")
    assert loader.spec_class("search_space").__module__ == "crossflow.search.space"


def test_an_unregistered_kind_is_a_clear_config_error(monkeypatch):
    from crossflow.config import loader
    from crossflow.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown kind 'nope'") as err:
        loader.load_spec({"kind": "nope"})
    assert "gemm" in err.value.allowed and "study" in err.value.allowed
    # declared, but the module named does not register it: said so, not a KeyError
    monkeypatch.setitem(loader.ENTRY_POINTS, "ghost", ("workloads", "crossflow.units"))
    with pytest.raises(ConfigError, match="importing crossflow.units did not register it"):
        loader.load_spec({"kind": "ghost"}, "workloads")


# --- citations of docs/architecture.md resolve ---------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: ``docs/architecture.md, "Section name"`` or ``docs/architecture.md, Section`` (a bare
#: name runs to the first ``)``, ``;``, ``,``, ``.``, quote or line end); a citation of the
#: file alone cites no section.
CITATION = re.compile(r'docs/architecture\.md,\s*(?:"([^"]+)"|([A-Z][^);,."\n]*))')


def headings() -> set[str]:
    return {line[3:].strip() for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines()
            if line.startswith("## ")}


def citations(text: str) -> list[tuple[int, str]]:
    """(line, section name) of every citation of a section of docs/architecture.md; a
    quoted name may run over a line break (a docstring wrapped in the middle of it)."""
    return [(text.count("\n", 0, m.start()) + 1,
             " ".join((m.group(1) or m.group(2)).split()))
            for m in CITATION.finditer(text)]


def test_the_citation_parser():
    text = ('x (docs/architecture.md, "Layers").\n'
            '"""Y (docs/architecture.md, "Data\n  flow of one prediction").\n'
            "z (docs/architecture.md, Studies), one module per job\n"
            "w (docs/architecture.md, Command line); v docs/architecture.md.\n"
            "see `docs/architecture.md`: the layers, and docs/architecture.md, which ...\n")
    assert citations(text) == [(1, "Layers"), (2, "Data flow of one prediction"),
                               (4, "Studies"), (5, "Command line")]


def _cited_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in (PACKAGE, ROOT / "docs"):
        for folder, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files += [Path(folder, n) for n in names
                      if Path(n).suffix in (".py", ".md", ".yaml", ".yml", ".csv", ".txt")]
    return sorted(files)


def test_every_citation_of_the_architecture_names_one_of_its_sections():
    """Docstrings, docs and the README cite docs/architecture.md by section: each section
    named exists as a ``## `` heading there."""
    known = headings()
    assert {"Layers", "Studies", "Tracking", "Command line"} <= known
    bad, seen = [], 0
    for path in _cited_files():
        for line, name in citations(path.read_text(encoding="utf-8", errors="replace")):
            seen += 1
            if name not in known:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {name!r}")
    assert seen > 10, "the citations were not found: is the pattern right?"
    assert not bad, ("citations of docs/architecture.md naming no heading of it (headings: "
                     + ", ".join(sorted(known)) + "):\n" + "\n".join(bad))
