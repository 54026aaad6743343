"""The import direction of the design: specdiff_cli -> specdiff (its runtimes/ and exporters/ included);
specdiff/runtimes, specdiff/exporters -> the rest of specdiff; inside specdiff the tools (specdiff/tools: bench, conversion;
specdiff/training: distillation) import the algorithm and never the reverse, and the methods never
import the run that prepares them. Proposers are told apart by their own module only: the rest reads
the Decoder contract. The one crossing between exporters and runtimes: export validation runs the
graphs it wrote on ONNX Runtime."""

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "specdiff (algorithm)"
TOOLS = ("tools", "training", "runtimes", "exporters")  # the packages of specdiff built on the algorithm
RUNTIMES, EXPORTERS = "specdiff.runtimes", "specdiff.exporters"
FORBIDDEN = {CORE: {"specdiff_cli", EXPORTERS, RUNTIMES, "specdiff.tools", "specdiff.training"},
             "specdiff/methods": {"specdiff.generation", "specdiff.ray"},  # a method knows no run
             "specdiff/tools": {"specdiff_cli", EXPORTERS, RUNTIMES},
             "specdiff/training": {"specdiff_cli", EXPORTERS, RUNTIMES},
             "specdiff/runtimes": {"specdiff_cli", EXPORTERS, "specdiff.tools", "specdiff.training"},
             "specdiff/exporters": {"specdiff_cli", RUNTIMES, "specdiff.tools", "specdiff.training"}}
ALLOWED = {("specdiff/exporters/validate.py", "specdiff.runtimes.onnxruntime")}


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of everything a file imports (relative imports resolved)."""
    package = _module(path) if path.name == "__init__.py" else _module(path)[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return names


def _files(group: str) -> list[Path]:
    if group == CORE:
        return [p for p in (ROOT / "specdiff").rglob("*.py") if p.relative_to(ROOT).parts[1] not in TOOLS]
    return list((ROOT / group).rglob("*.py"))


def _violates(name: str, banned: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("group", sorted(FORBIDDEN))
def test_import_direction(group):
    bad = {}
    for path in _files(group):
        rel = str(path.relative_to(ROOT))
        allowed = {m for f, m in ALLOWED if f == rel}
        hits = sorted(n for n in imported_modules(path)
                      if _violates(n, FORBIDDEN[group]) and not _violates(n, allowed))
        if hits:
            bad[rel] = hits
    assert not bad


def test_the_checker_resolves_relative_imports():
    """Relative imports must resolve to the modules they name, else the test above is blind."""
    bench = ROOT / "specdiff" / "tools" / "bench"
    assert {"specdiff.tools.callstats", "specdiff.metrics", "specdiff.tools.bench.passes"} <= \
        imported_modules(bench / "measure.py")
    assert {"specdiff.errors", "specdiff.generation", "specdiff.tools.bench.config"} <= \
        imported_modules(bench / "__init__.py")  # a package's own relative imports
    assert "specdiff.contracts" in imported_modules(ROOT / "specdiff" / "decoding.py")
    assert _violates("specdiff.tools.bench", FORBIDDEN[CORE])
    assert "specdiff.drafters.diffusion.DiffusionDrafter" in imported_modules(ROOT / "specdiff" / "training" / "losses.py")
    assert _violates("specdiff.training.distill", FORBIDDEN[CORE])


LIBRARY = ("specdiff",)  # specdiff_cli turns parameters into flags (specdiff_cli/flags.py)
FLAG = re.compile(r"(?<![\w-])--[a-z{]")


def _text(node: ast.Constant | ast.JoinedStr) -> str:
    """A string literal as written, an f-string's fields as {}: f"--{name}" names a flag too."""
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return node.value


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, kinds) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def string_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal but docstrings, an f-string as one literal. Messages are
    often built before their raise (a table of what each option needs, a `why` clause), so every
    literal counts, not only those inside a raise."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in ast.walk(node) if v is not node}
    return [(n.lineno, _text(n)) for n in ast.walk(tree) if id(n) not in skip
            and (isinstance(n, ast.JoinedStr) or isinstance(n, ast.Constant) and isinstance(n.value, str))]


def _raises(path: Path) -> list[ast.Raise]:
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Raise)]


def _library_files() -> list[Path]:
    return [p for package in LIBRARY for p in sorted((ROOT / package).rglob("*.py"))]


def test_library_errors_name_parameters_and_keep_their_cause():
    """The library speaks in parameters (`truncate_prompt`), which the CLI shows as flags, and a
    library error raised while handling another keeps it as its cause (no `from None`)."""
    flags, dropped = [], []
    for path in _library_files():
        where = path.relative_to(ROOT)
        flags += [f"{where}:{line}: {text}" for line, text in string_literals(path.read_text(encoding="utf-8"))
                  if FLAG.search(text)]
        dropped += [f"{where}:{node.lineno}" for node in _raises(path)
                    if isinstance(node.cause, ast.Constant) and node.cause.value is None]
    assert not flags and not dropped, "\n".join(flags + dropped)


def test_the_flag_check_sees_fstrings_and_messages_built_before_the_raise():
    """Negative controls: each of these names a flag, so the test above must see it."""
    source = ('why = " (use --format onnx)"\n'
              'raise UsageError(f"--{name} must be >= 1" + why)\n'
              'raise UsageError(f"--max-batch {n} is too large")\n')
    texts = [text for _, text in string_literals(source)]
    assert sorted(t for t in texts if FLAG.search(t)) == [" (use --format onnx)", "--max-batch {} is too large",
                                                          "--{} must be >= 1"]
    assert not [t for t in ("`batch_size` must be >= 1", "a well-formed text", "x--y")
                if FLAG.search(t)]
    assert {"runtimes", "exporters", "tools"} <= {p.relative_to(ROOT).parts[1] for p in _library_files()}


PROPOSERS = {"SelfSelection": "specdiff/selection.py", "DiffusionProposer": "specdiff/drafters/diffusion.py",
             "ARProposer": "specdiff/drafters/autoregressive.py"}


def isinstance_checks(source: str, classes: Iterable[str]) -> list[tuple[int, str]]:
    """(line, class) of each isinstance() whose classes (plain, qualified or in a tuple) name one of
    `classes`."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
            hits += [(node.lineno, name) for name in sorted(named & set(classes))]
    return hits


def proposer_checks(source: str) -> list[tuple[int, str]]:
    """(line, class) of each isinstance() whose classes name a proposer of PROPOSERS."""
    return isinstance_checks(source, PROPOSERS)


def test_no_isinstance_on_proposers_outside_their_own_module():
    """Self-selection was threaded through generation and decoding by isinstance four times; a
    method's decoder now holds what it needs (methods/speculative.py)."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for package in (*LIBRARY, "specdiff_cli")
           for path in sorted((ROOT / package).rglob("*.py"))
           for line, name in proposer_checks(path.read_text(encoding="utf-8"))
           if str(path.relative_to(ROOT)) != PROPOSERS[name]]
    assert not bad, "\n".join(bad)


def test_the_proposer_check_sees_qualified_and_tuple_classes():
    source = ("isinstance(p, selection.SelfSelection)\nisinstance(p, (ARProposer, int))\n"
              "isinstance(p, Proposer)\n")
    assert proposer_checks(source) == [(1, "SelfSelection"), (2, "ARProposer")]



DRAFTERS = {"DiffusionDrafter": "specdiff/drafters/diffusion.py", "DFlashDrafter": "specdiff/drafters/dflash.py",
            "Eagle3Drafter": "specdiff/drafters/eagle3.py", "ARDrafter": "specdiff/drafters/autoregressive.py",
            "A2DDrafter": "specdiff/drafters/a2d.py"}


def drafter_checks(source: str) -> list[tuple[int, str]]:
    """(line, class) of each isinstance() whose classes name a drafter of DRAFTERS."""
    return isinstance_checks(source, DRAFTERS)


def test_drafter_kinds_are_told_apart_by_their_declarations_only():
    """A drafter's kind is declared once (specdiff/kinds): outside its declaration and its own
    module, code asks the kind (kind_of(drafter).converting, .compiling, .graph...), not isinstance."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for package in (*LIBRARY, "specdiff_cli")
           for path in sorted((ROOT / package).rglob("*.py"))
           for line, name in drafter_checks(path.read_text(encoding="utf-8"))
           if str(path.relative_to(ROOT)) != DRAFTERS[name] and path.relative_to(ROOT).parts[:2] != ("specdiff", "kinds")]
    assert not bad, "\n".join(bad)


def test_the_drafter_check_sees_qualified_and_tuple_classes():
    source = "isinstance(d, diffusion.DiffusionDrafter)\nisinstance(d, (ARDrafter, DFlashDrafter))\nisinstance(d, int)\n"
    assert drafter_checks(source) == [(1, "DiffusionDrafter"), (2, "ARDrafter"), (2, "DFlashDrafter")]

def packages() -> list[Path]:
    return sorted(p.parent for package in (*LIBRARY, "specdiff_cli") for p in (ROOT / package).rglob("__init__.py"))


def test_every_package_says_what_lives_there_and_what_it_may_import():
    silent = [str(p.relative_to(ROOT)) for p in packages()
              if "May import:" not in (ast.get_docstring(ast.parse((p / "__init__.py").read_text())) or "")]
    assert not silent


def test_the_code_map_names_every_module_of_specdiff():
    """specdiff/__init__'s docstring maps the rooms: a module or package it does not name is one a
    new engineer cannot find."""
    doc = ast.get_docstring(ast.parse((ROOT / "specdiff" / "__init__.py").read_text())) or ""
    rooms = [p.name if p.is_file() else p.name + "/" for p in (ROOT / "specdiff").iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()]
    assert len(rooms) > 20 and [r for r in rooms if r not in doc] == []


MAX_MODULE_LINES = 400  # docs/code-layout.md: a module is read whole; past this it holds two concerns


def test_no_module_is_longer_than_a_reader_takes_in():
    long = {str(p.relative_to(ROOT)): n for p in sorted([*(ROOT / "specdiff").rglob("*.py"),
                                                        *(ROOT / "specdiff_cli").rglob("*.py")])
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}



def module_imports(path: Path) -> set[str]:
    """What a file imports when it is imported: its top-level imports, those under `if` (type-only
    ones included) and `try`; imports inside functions are deferred and run later."""
    package = _module(path) if path.name == "__init__.py" else _module(path)[:-1]
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                names.update({module} | {f"{module}.{a.name}" for a in node.names})
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse)
    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def import_cycles() -> list[list[str]]:
    """The strongly connected groups of more than one specdiff module in the graph of module_imports."""
    paths = {".".join(_module(p)): p for p in (ROOT / "specdiff").rglob("*.py")}
    graph = {m: {n for n in module_imports(p) if n in paths and n != m} for m, p in paths.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                groups.append(sorted(group))
    for module in sorted(graph):
        if module not in order:
            connect(module)
    return sorted(groups)


def test_no_import_cycles_type_only_ones_included():
    """A type lives in the room that owns it: Row in contracts, Costs in metrics, Task in
    training/checkpoints (which saves it), loss_function's settings as a protocol in losses."""
    assert import_cycles() == []


def test_the_cycle_finder_sees_type_only_imports():
    assert "specdiff.contracts.Row" in module_imports(ROOT / "specdiff" / "adaptive.py")  # under TYPE_CHECKING



TESTS = ROOT / "tests"


def imported_test_modules(source: str) -> list[str]:
    """The test modules (test_*) a file of tests/ imports, anywhere in it (inside functions too), or
    loads as a pytest plugin (pytest_plugins). tests/ is no package: its imports are absolute."""
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return sorted({name.split(".")[0] for name in names if name.split(".")[0].startswith("test_")})


def test_no_test_module_imports_another():
    """Tests share helpers through helper modules and fixtures (conftest.py's docstring says which),
    never through another test module's names or fixtures: a test module imported runs whatever
    it does at import, and a fixture imported from one is a second copy of it."""
    bad = {p.name: found for p in sorted(TESTS.glob("*.py"))
           if (found := imported_test_modules(p.read_text(encoding="utf-8")))}
    assert bad == {}


def test_the_test_import_check_sees_imports_inside_functions_and_plugins():
    source = ("import test_a as a\nfrom test_b import x\nimport exactness as exact\n\n\ndef f():\n"
              "    from test_c.d import y\n\n\npytest_plugins = ['exported', 'test_e']\n")
    assert imported_test_modules(source) == ["test_a", "test_b", "test_c", "test_e"]
    assert imported_test_modules((TESTS / "test_selection.py").read_text(encoding="utf-8")) == []


def test_conftest_names_every_shared_module_of_tests():
    """conftest.py's docstring says the layout of tests/: a helper or plugin module it does not name
    is one a test author cannot find."""
    doc = ast.get_docstring(ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))) or ""
    shared = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")
    assert len(shared) > 5 and [name for name in shared if name not in doc] == []


def test_ci_runs_every_slow_case_by_its_marker():
    """.ci/run's slow step once listed modules by hand and left tests/test_eagle3_onnx.py out, so CI
    never ran its slow case: the step selects by marker and names no module, and every module
    with slow cases is then in it by construction."""
    steps = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if line.startswith("run_pytest -m slow")]
    assert steps == ['run_pytest -m slow "$@" || status=$?']
    ini = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "addopts = \"-q -m 'not slow and not long and not power'\"" in ini
