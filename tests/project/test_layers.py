"""The package's imports go down its layers (docs/layout.md draws them): no module imports one
of a layer above its own, nothing imports in a circle, no architecture imports another
architecture's folder, and no module imports the front of a package that holds it.

Every import counts, at the top of a module or inside a function, except those under
``if TYPE_CHECKING:`` (annotations only: they never run)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
import torch

import mcsd
from helpers.models import TINY, tiny_model, tiny_model_to_compile
from mcsd.models import ARCHITECTURE_FOLDERS, ForwardContext, registry
from mcsd.ops.dispatch import dispatch

PACKAGE = Path(mcsd.__file__).parent
TESTS = Path(__file__).parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # bottom to top; a module's layer is its longest prefix's
    ("base", ("mcsd.errors", "mcsd.files", "mcsd.jobs", "mcsd.lazy", "mcsd.markdown", "mcsd.precision", "mcsd.runtime")),
    ("ops", ("mcsd.ops",)),
    ("data", ("mcsd.data",)),
    ("model config", ("mcsd.models.config",)),
    ("shared model pieces", ("mcsd.models.modules",)),
    ("decoding at fixed addresses", ("mcsd.models.cuda_graphs",)),
    ("decoding", ("mcsd.models.decoding",)),
    ("skeleton", ("mcsd.models.modeling",)),
    ("registry", ("mcsd.models.registry",)),
    ("architectures", tuple(f"mcsd.models.{name}" for name in ARCHITECTURE_FOLDERS)),
    ("building", ("mcsd.models.build",)),
    ("models front", ("mcsd.models",)),
    ("result files", ("mcsd.checkpoint.bench_results", "mcsd.checkpoint.eval_results", "mcsd.checkpoint.probe_results")),
    ("sharded checkpoints", ("mcsd.checkpoint.sharded",)),
    ("lightning checkpoints", ("mcsd.checkpoint.lightning_checkpoint",)),
    ("lightning checkpoint writer", ("mcsd.checkpoint.lightning_writer",)),
    ("saved models", ("mcsd.checkpoint.saved_model",)),
    ("run folders", ("mcsd.checkpoint.run_folder",)),
    ("model sources", ("mcsd.checkpoint.model_source",)),
    ("resuming", ("mcsd.checkpoint.resume",)),
    ("checkpoints front", ("mcsd.checkpoint",)),
    ("hugging face", ("mcsd.hf",)),
    ("deployment", ("mcsd.deploy",)),
    ("libraries", ("mcsd.training", "mcsd.bench", "mcsd.evaluation", "mcsd.probes", "mcsd.plots")),
    ("command plumbing", ("mcsd.commands.app",)),
    ("commands", ("mcsd.commands",)),
    ("front", ("mcsd", "mcsd.hf.remote_code")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of mcsd (not a name defined in one)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(path: Path) -> set[str]:
    """The mcsd modules ``path`` imports (``from package import submodule`` names the submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "mcsd"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "mcsd":
                continue
            submodules = {f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}")}
            found |= submodules or {base}
            if len(submodules) < len(node.names):
                found.add(base)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS here and to docs/layout.md")
    return max(matches)[1]


def architecture_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "models" and parts[2] in ARCHITECTURE_FOLDERS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} ({LAYERS[layer_of(module)][0]}) imports {imported} ({LAYERS[layer_of(imported)][0]})"
            for module, imported_modules in graph.items() for imported in sorted(imported_modules)
            if layer_of(imported) > layer_of(module)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_every_module_is_in_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_module_imports_upward() -> None:
    assert upward_imports(import_graph()) == []


def test_no_module_imports_in_a_circle() -> None:
    assert cycles(import_graph()) == []


def test_no_architecture_imports_another() -> None:
    crossing = [f"{module} imports {imported}" for module, imported_modules in import_graph().items()
                for imported in imported_modules
                if architecture_of(module) and architecture_of(imported) not in (None, architecture_of(module))]
    assert crossing == []


def test_no_module_imports_the_front_of_a_package_that_holds_it() -> None:
    fronts = [f"{module} imports {imported}" for module, imported_modules in import_graph().items()
              for imported in imported_modules if module.startswith(imported + ".")
              and (PACKAGE.parent / imported.replace(".", "/") / "__init__.py").is_file()
              and module not in LAYERS[-1][1]]
    assert fronts == []


@pytest.mark.parametrize("edit, problem", [
    ({"mcsd.ops.common": {"mcsd.models.modeling"}}, "upward"),
    ({"mcsd.models.modeling": {"mcsd.models.build"}}, "upward"),
    ({"mcsd.checkpoint.sharded": {"mcsd.checkpoint.saved_model"}}, "upward"),
    ({"mcsd.training.fsdp": {"mcsd.training.module"}}, "circle"),
])
def test_the_checks_catch_an_upward_import_and_a_circle(edit: dict[str, set[str]], problem: str) -> None:
    graph = import_graph()
    for module, added in edit.items():
        graph[module] = graph[module] | added
    if problem == "upward":
        assert len(upward_imports(graph)) == 1
    else:
        assert cycles(graph) == [["mcsd.training.fsdp", "mcsd.training.module"]]


def ops_reached(call: Callable[[], object]) -> set[str]:
    """The op packages (``mcsd/ops/<op>/``) whose functions ``call`` runs."""
    ops = PACKAGE / "ops"
    reached: set[str] = set()

    def record(frame: FrameType, event: str, _: object) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.parent.parent == ops:
                reached.add(path.parent.name)

    sys.setprofile(record)
    try:
        call()
    finally:
        sys.setprofile(None)
    return reached


@pytest.mark.parametrize("name", registry.architectures())
@torch.no_grad()
def test_every_form_and_the_step_run_through_the_architectures_ops(name: str) -> None:
    """Each architecture computes every form, and its decoding step, through exactly the ops the
    registry names for it (no mixer keeps a recurrence of its own beside its op), with a layer of
    each kind it has (the hybrid's attention too)."""
    model = tiny_model_to_compile(name)
    tokens = torch.randint(0, TINY["vocab_size"], (2, 20))
    expected = set(model.architecture.ops)
    for form in model.architecture.forms:
        assert ops_reached(lambda: model(tokens, form=form)) == expected, form
    _, state = model.prefill(tokens, max_new_tokens=1)
    assert ops_reached(lambda: model.step(tokens[:, -1], state)) == expected, "step"


def contexts_dispatched(call: Callable[[], object]) -> list[ForwardContext]:
    """The :class:`ForwardContext` of every op call that ``call`` makes through the dispatcher."""
    contexts: list[ForwardContext] = []

    def record(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code is dispatch.__code__:
            contexts.append(frame.f_locals["context"])

    sys.setprofile(record)
    try:
        call()
    finally:
        sys.setprofile(None)
    return contexts


@pytest.mark.parametrize("name", [name for name in registry.architectures() if registry.get(name).fla_ops])
@torch.no_grad()
def test_the_ops_get_the_calls_context_and_no_mixer_keeps_a_copy(name: str) -> None:
    """Form, kernels, chunk size and documents reach the ops in the one context each call builds
    (:meth:`CausalLM.context`; a decoding step's, :meth:`CausalLM.step_context`): the ops see what
    the model's config says after ``use_kernels``, and no module below the model stores any of them."""
    model = tiny_model(name, chunk_size=4)
    model.use_kernels("auto")
    kept = sorted((path, attribute) for path, module in model.named_modules() if path
                  for attribute in ("form", "kernels", "chunk_size", "starts", "position_ids") if attribute in vars(module))
    assert kept == []
    tokens = torch.randint(0, TINY["vocab_size"], (2, 12))
    attention_only = all(layer.state_rewinds for layer in model.layers)  # attention is no dispatched op (yet)
    for form in model.architecture.forms:
        contexts = contexts_dispatched(lambda: model(tokens, form=form))
        assert (contexts or attention_only) and all(context == (form, "auto", 4, None, None)
                                                     for context in contexts), form
    if model.separates_documents:
        position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]] * 2)
        contexts = contexts_dispatched(lambda: model(tokens, position_ids=position_ids))
        rows = position_ids.repeat(model.streams.count, 1)
        assert contexts and all(torch.equal(context.starts, rows == 0) and torch.equal(context.position_ids, rows)
                                for context in contexts)
    _, state = model.prefill(tokens, max_new_tokens=1)
    steps = contexts_dispatched(lambda: model.step(tokens[:, -1], state))
    assert (steps or attention_only) and all(context == ForwardContext.step("auto", 4) for context in steps)


def test_every_command_is_a_module_of_the_command_package() -> None:
    """Every console script runs a module of ``mcsd.commands``, and no module outside that
    package is a Hydra app or defines a ``main``."""
    import tomllib

    scripts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts and all(target.startswith("mcsd.commands.") for target in scripts.values())
    apps = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            called = (node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else
                      node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None)
            if (isinstance(node, ast.FunctionDef) and node.name == "main") or called == "hydra_app":
                apps.append(module_name(path))
    outside = sorted({module for module in apps if not module.startswith("mcsd.commands.")})
    assert outside == [] and {target.split(":")[0] for target in scripts.values()} <= set(apps)


LIGHT_COMMANDS = ("mcsd.commands.bench", "mcsd.commands.generate", "mcsd.commands.plot", "mcsd.commands.train")
"""Commands whose module imports no Lightning, transformers or torchao: ``mcsd-train`` imports what
trains (:mod:`mcsd.training.run`) only in a process that trains."""


@pytest.mark.slow
def test_the_front_loads_its_names_on_first_use_and_commands_import_only_what_they_run() -> None:
    """``import mcsd`` imports no torch (its names load when first read: ``mcsd.build_model``), and
    the light commands import no Lightning, transformers or torchao, each a second or more of every
    start (a sweep's launching process, ``--help``, a refused setting, a benchmark point's process);
    the sweep's Hydra callback neither."""
    import subprocess

    probe = ("import sys, mcsd\n"
             "print(sorted(name for name in ('torch', 'lightning', 'transformers') if name in sys.modules))\n"
             f"import {', '.join(LIGHT_COMMANDS)}, mcsd.training.sweep\n"
             "print(sorted(name for name in ('lightning', 'transformers', 'torchao') if name in sys.modules))\n"
             "print(mcsd.build_model.__module__, 'save' in dir(mcsd))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["[]", "[]", "mcsd.models.build True"]


RESULT_FORMATS = {"mcsd.checkpoint.bench_results": ("results.csv", "results.json"),
                  "mcsd.checkpoint.eval_results": ("results.json", "table2.md"),
                  "mcsd.checkpoint.probe_results": ("context_curve.csv", "context_delta.csv",
                                                    "context_losses.safetensors"),
                  "mcsd.checkpoint.lightning_checkpoint": ("checkpoints", "last.ckpt"),
                  "mcsd.checkpoint.saved_model": ("model.safetensors", "config.json", "tokenizer.json", "training.json"),
                  "mcsd.deploy.onnx_runner": ("export.json", "prefill.onnx", "step.onnx", "tokenizer.json")}
"""Each on-disk format's module and the file names it owns: the commands' result files, a run's
checkpoints, a model folder, an ONNX export (a model is located by its module alone)."""


def test_result_files_are_named_only_by_their_format_module() -> None:
    """A result file's (or a model folder's, a run's checkpoints') name, as a path is built from it, appears only in the module that writes and
    reads its format (a docstring or a message may mention it; a string that is the name alone is
    a path): every other module reads and writes it through that module."""
    names = {name for files in RESULT_FORMATS.values() for name in files}
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.setdefault(node.value, set()).add(module_name(path))
    assert found == {name: {module for module, files in RESULT_FORMATS.items() if name in files} for name in names}


def test_a_curve_key_is_built_and_split_only_by_its_owner() -> None:
    """A curve's key (``arch|variant``, ``arch|size``) is built by ``mcsd.plots.runs.curve_key``
    and split by ``split_curve`` alone: no other module, and no test, splits on, adds or formats
    the separator (a test that spelled the key itself would pass with the owner changed)."""
    spelled = set()
    for path in [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            split = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
                     and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "|")
            added = (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
                     and any(isinstance(side, ast.Constant) and side.value == "|" for side in (node.left, node.right)))
            formatted = isinstance(node, ast.JoinedStr) and any(
                isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant) and b.value == "|"
                and isinstance(c, ast.FormattedValue) for a, b, c in zip(node.values, node.values[1:], node.values[2:]))
            if split or added or formatted:
                spelled.add(module_name(path) if path.is_relative_to(PACKAGE) else str(path.relative_to(TESTS.parent)))
    assert spelled == {"mcsd.markdown", "tests/project/test_docs.py"}  # a table's cell borders, not a key
