"""The layers never reach across (docs/architecture.md): read from the modules' own imports."""

import ast
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parent.parent / "specdemo"
CORE = {"events", "steps", "recorder", "kvcache", "attention", "grouped_attention", "static", "llama", "graphs",
        "prepack", "verify", "loop", "sampling", "errors", "process", "transfer", "threads"}
METHODS = {"ar", "speculative", "draft_tree", "static_draft_tree", "device_draft_tree", "draft", "eagle",
           "prompt_lookup", "retrieval", "medusa_heads", "medusa_tree", "medusa", "lookahead", "jacobi", "cllm", "beam",
           "contrastive"}
# a package: its `__init__` and its modules
VIEWS = {"views", "views.html", "views.figures", "views.trees", "views.pictures", "views.explain"}
APP = {"ui", "ui_offload", "ui_settings", "handlers", "targets", "drawing", *VIEWS, "live", "limits", "lesson",
       "one_run", "zerogpu", "clicks", "wiring"}
LAYERS = {"core": CORE, "methods": METHODS, "app": APP}  # each layer is a folder of specdemo/
PACKAGES = {"specdemo", *(f"specdemo.{layer}" for layer in LAYERS)}


def source(module: str) -> Path:
    """A module's file; a package's (`views`) is its `__init__.py`, its modules dotted (`views.html`)."""
    path = next(PACKAGE / layer / module.replace(".", "/") for layer, modules in LAYERS.items() if module in modules)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def modules_in(layer: str) -> set[str]:
    """The modules in a layer's folder, by the names `source` takes."""
    folder = PACKAGE / layer
    names = {".".join(path.relative_to(folder).with_suffix("").parts) for path in folder.rglob("*.py")}
    return {name.removesuffix(".__init__") for name in names} - {"__init__"}


def imports(module: str) -> set[str]:
    """What a module imports, by last name: `torch`, `gradio`, `specdemo.core.verify` as `verify`,
    `from specdemo.methods import ar` as `ar` and `methods` (the registry)."""
    names = set()
    for node in ast.walk(ast.parse(source(module).read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module in PACKAGES:
            names |= {node.module.rsplit(".", 1)[-1], *(alias.name for alias in node.names)}
        elif isinstance(node, ast.ImportFrom) and node.module.startswith("specdemo."):
            names.add(node.module.rsplit(".", 1)[-1])
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    return names


def test_each_layer_is_a_folder():
    for layer, modules in LAYERS.items():
        assert modules_in(layer) == modules, layer


@pytest.mark.parametrize("module", sorted(CORE | METHODS))
def test_decoding_never_imports_the_page_or_its_pictures(module):
    assert not imports(module) & {"gradio", "plotly", "spaces", *APP, "bench"}


@pytest.mark.parametrize("module", sorted(CORE))
def test_the_core_knows_no_method(module):
    assert not imports(module) & (METHODS | {"methods", "models", "presets"})


def test_the_presets_name_companions_without_importing_a_method():
    """The methods' registry reads the presets (`methods.method_options`): the presets sit below
    the methods, naming the companions by the paths of `specdemo.assets`."""
    tree = ast.parse((PACKAGE / "presets.py").read_text())
    named = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "specdemo.assets" in named and not {name for name in named if name.startswith("specdemo.methods")}


@pytest.mark.parametrize("module", ["ui", "ui_offload", "ui_settings", "handlers", "targets", *sorted(VIEWS), "lesson",
                                    "clicks"])
def test_the_page_never_touches_tensors_or_a_model(module):
    """The page and its pictures read events; `live` runs a method, through the registry."""
    assert not imports(module) & {"torch", "transformers", *CORE - {"events", "steps", "errors", "sampling"}, *METHODS}


def test_live_runs_methods_without_tensors_or_the_page():
    assert not imports("live") & {"torch", "transformers", "gradio", "plotly", "ui", "views"}


@pytest.mark.parametrize("module", ["ui", "ui_offload", "handlers"])
def test_the_page_reaches_decoding_only_through_live(module):
    tree = ast.parse(source(module).read_text())
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert not calls & {"generate", "forward"}  # no method's generator, no model pass
    assert "gradio" in imports(module) and "plotly" in imports("views.figures")


def test_the_worked_example_of_docs_architecture_runs(tiny_model):
    """The page's proposer file and registry line, run as written: a method that gives AR's answer."""
    import re
    import sys
    import types

    from specdemo.core.events import final_summary
    from specdemo.methods import MethodSpec, ar

    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    proposer_file, registry_line = re.findall(r"```python\n(.*?)```", text, re.S)
    module = types.ModuleType("specdemo.methods.prompt_lookup_decoding")
    sys.modules[module.__name__] = module
    try:
        exec(compile(proposer_file, "docs/architecture.md", "exec"), module.__dict__)
        entries = eval("{" + registry_line + "}", {"MethodSpec": MethodSpec, "prompt_lookup_decoding": module})
    finally:
        del sys.modules[module.__name__]
    spec = entries["prompt_lookup"]
    assert spec.settings == ("length",)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])  # a text that repeats: copies get proposed
    expected = final_summary(ar.generate(tiny_model, prompt, max_new_tokens=30, eos_token_ids=())).tokens
    summary = final_summary(spec.generate(tiny_model, prompt, max_new_tokens=30, eos_token_ids=()))
    assert summary.tokens == expected and summary.proposed > 0


def test_ruff_passes():
    """The style `pyproject.toml` asks for (`ruff check .`), on the whole checkout."""
    import shutil
    import subprocess
    import sys

    ruff = Path(sys.executable).with_name("ruff")
    ruff = str(ruff) if ruff.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `make test` installs it from requirements-test.txt")
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pages_controls_are_settings_of_their_methods():
    from specdemo.app.handlers import KNOBS
    from specdemo.methods import METHODS

    for spec in METHODS.values():
        assert set(spec.controls) <= set(spec.settings) & set(KNOBS), spec.name
    assert set(KNOBS) == {name for spec in METHODS.values() for name in spec.controls}  # every control serves a method


def test_no_forward_is_patched_and_no_module_changes_anything_at_import():
    """A model behaves as its modules say: no `forward` is assigned (a layer that computes otherwise
    is another module, swapped in the open: `prepack.PackedLinear`), and importing a module of
    `specdemo` calls nothing for its side effects (process-wide settings are `core.process`'s, made at load)."""
    patched, at_import = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            patched += [f"{path.name}:{node.lineno}" for target in targets if isinstance(target, ast.Attribute)
                        and target.attr == "forward"]
        at_import += [f"{path.name}:{node.lineno}" for node in tree.body if isinstance(node, ast.Expr)
                      and isinstance(node.value, ast.Call)]
    assert not patched and not at_import


def test_companions_are_held_with_their_target_not_in_module_caches():
    """A draft, heads, a CLLM or a datastore is loaded into its target's `LoadedModel.companions`:
    no loader of a companion is a functools cache (which would hold every target it ever saw)."""
    cached = []
    for path in sorted((PACKAGE / "methods").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith(
                    ("load", "method_options", "token_draft", "datastore_of")):
                cached += [f"{path.name}:{node.name}" for decorator in node.decorator_list
                           if "cache" in ast.unparse(decorator)]
    assert not cached


def test_modules_and_functions_fit_a_screen_or_two():
    """No module of `specdemo` is over 450 lines and no function over 60: each reads in a sitting."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 450:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60:
                too_long.append(f"{path.name}:{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long


def test_state_is_in_the_open_no_setattr_and_no_module_cache_of_models():
    """Nothing in `specdemo` calls `setattr` (a compiled pass is a value the loop receives, never
    an attribute of the model), declares `global`, or keeps a module-level container that starts
    empty to be filled at run time (a cache of models or companions would); module-level tables
    are constants, named in capitals; a cached function takes data, never a model."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                found.append(f"{path.name}:{node.lineno}: setattr")
            if isinstance(node, ast.Global):
                found.append(f"{path.name}:{node.lineno}: global")
            if isinstance(node, ast.FunctionDef) and any("cache" in ast.unparse(d) for d in node.decorator_list):
                takes = {argument.arg for argument in node.args.args}
                found += [f"{path.name}:{node.name}: cached on a model"
                          for _ in takes & {"model", "target", "draft", "loaded"}]
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                names = [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                         if isinstance(t, ast.Name)]
                value = node.value
                container = isinstance(
                    value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp) or (
                    isinstance(value, ast.Call)
                    and ast.unparse(value.func).split(".")[-1] in {"dict", "list", "set", "defaultdict", "OrderedDict"})
                empty = isinstance(value, ast.Call) and not value.args or isinstance(
                    value, ast.Dict | ast.List | ast.Set) and not (
                    getattr(value, "keys", None) or getattr(value, "elts", None))
                found += [f"{path.name}:{node.lineno}: {name}" for name in names
                          if container and (empty or not (name.isupper() or name == "__all__"))]
    assert not found
