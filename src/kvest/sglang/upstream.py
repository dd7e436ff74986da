"""SGLang's own code, loaded from its files without importing sglang.

The doctor (``python -m kvest sglang``), the tests and the benchmarks compare
kvest against SGLang as shipped.  Importing sglang needs torch and a long list
of dependencies; its scheduler bookkeeping does not.  So the functions that
matter are taken out of the files with :mod:`ast`, compiled on their own (line
numbers and file names kept, so ``inspect.getsource`` works on them) and put in
stand-in modules under sglang's real module names, together with small
stand-ins for what they read (server args, the speculative algorithm, the
batch).  :func:`standin_tree` registers those modules in ``sys.modules`` for the
duration of a ``with`` block, so that ``kvest.sglang.patch()`` and SGLang's own
``load_plugins()`` run against them exactly as they would against the real
modules.

Nothing from SGLang is copied into kvest: the files are read where pip put
them (an installed distribution) or from a release's wheel.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import re
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvest.sglang import registry

__all__ = [
    "Config",
    "SourceTree",
    "StandinTree",
    "installed",
    "standin_tree",
    "wheel",
]

# The functions of each module the stand-ins hold (hot spots, the helpers their
# patterns check, the settings the bookkeeping reads), and the batch's methods.
def _wanted() -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    functions: dict[str, tuple[str, ...]] = {}
    methods: list[str] = list(registry.BATCH_HELPERS)
    for spot in (*registry.HOTSPOTS.values(), *registry.HELPERS.values()):
        if spot.cls is not None:
            methods.append(spot.attr)
            continue
        for module in spot.modules:
            functions[module] = (*functions.get(module, ()), spot.attr)
    for module in registry.ALLOC_SETTINGS_MODULES:
        functions[module] = (*functions.get(module, ()), *registry.ALLOC_SETTINGS)
    return functions, tuple(dict.fromkeys(methods))


def _module_name(relpath: str) -> str:
    name = relpath.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


class SourceTree:
    """A directory holding an ``sglang/`` package's files, and its version."""

    def __init__(self, root: Path | str, version: str) -> None:
        self.root = Path(root)
        self.version = version
        self._trees: dict[str, ast.Module] = {}

    def __repr__(self) -> str:
        return f"SourceTree({str(self.root)!r}, version={self.version!r})"

    def path(self, relpath: str) -> Path:
        return self.root / relpath

    def exists(self, relpath: str) -> bool:
        return self.path(relpath).is_file()

    def tree(self, relpath: str) -> ast.Module:
        if relpath not in self._trees:
            path = self.path(relpath)
            self._trees[relpath] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        return self._trees[relpath]

    def defines(self, relpath: str, name: str) -> bool:
        """Whether the file has a top-level ``def name`` or ``class name``."""
        return self.exists(relpath) and _find(self.tree(relpath), name) is not None


def installed() -> SourceTree | None:
    """The installed sglang distribution's files (``None`` if it is not installed)."""
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file("")))
    if not (root / registry.module_file(registry.BATCH)).is_file():
        return None
    return SourceTree(root, dist.version)


def wheel(path: Path | str, cache: Path | str | None = None) -> SourceTree:
    """A release's wheel: the relevant files are unpacked once beside it (or under ``cache``)."""
    path = Path(path)
    match = re.match(r"sglang-([^-]+)-", path.name)
    if match is None:
        raise ValueError(f"{path.name} is not an sglang wheel")
    version = match.group(1)
    dest = Path(cache) if cache is not None else path.parent
    dest = dest / f"sglang-{version}-files"
    marker = dest / ".complete"
    files = registry.files()
    wanted = "\n".join((version, *files))  # a new file list unpacks again
    if not marker.is_file() or marker.read_text() != wanted:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            for rel in files:
                if rel in names:
                    zf.extract(rel, dest)
        marker.write_text(wanted)
    return SourceTree(dest, version)


# ------------------------------------------------------------------ compiling

def _find(tree: ast.Module, name: str) -> ast.stmt | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


class _Placeholders(dict):
    """Locals for compiling lone definitions: any name a default value or a
    decorator needs at definition time resolves to an inert placeholder."""

    def __missing__(self, key: str) -> Any:
        if hasattr(builtins, key):
            return getattr(builtins, key)
        return _Placeholder(key)


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder(f"{self._name}()")

    def __repr__(self) -> str:
        return f"<placeholder {self._name}>"


def _compile_into(namespace: dict[str, Any], nodes: list[ast.stmt], filename: str,
                  tree: ast.Module) -> None:
    """Compile definitions into ``namespace`` (a module's dict), decorators dropped
    except ``property``; the functions keep their file name and line numbers.
    The file's own imports are compiled along inside ``if False:`` (never run):
    they change how the compiler reads ``name.attr(...)``, so the functions get
    the code the real module has."""
    from kvest.sglang.rewrite import module_imports

    imports = module_imports(tree)
    body: list[ast.stmt] = [ast.If(ast.Constant(False), imports, [])] if imports else []
    for node in nodes:
        if isinstance(node, ast.FunctionDef):
            keep = [d for d in node.decorator_list
                    if isinstance(d, ast.Name) and d.id in ("property", "staticmethod",
                                                             "classmethod")]
            node = ast.FunctionDef(
                name=node.name, args=node.args, body=node.body, decorator_list=keep,
                returns=None, type_comment=None, **_positions(node),
            )
        body.append(node)
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)
    flags = __future__.annotations.compiler_flag  # annotations never evaluated
    code = compile(module, filename, "exec", flags=flags, dont_inherit=True)
    scratch = _Placeholders()
    exec(code, namespace, scratch)
    namespace.update(dict.items(scratch))


def _positions(node: ast.AST) -> dict[str, Any]:
    return {k: getattr(node, k) for k in ("lineno", "col_offset", "end_lineno", "end_col_offset")
            if hasattr(node, k)}


def _functions_using(tree: ast.Module, name: str) -> tuple[list[ast.FunctionDef],
                                                            dict[str, list[ast.FunctionDef]]]:
    """Top-level functions and class methods whose body mentions ``name``."""
    def mentions(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))

    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and mentions(n)]
    methods: dict[str, list[ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found = [m for m in node.body if isinstance(m, ast.FunctionDef) and mentions(m)]
            if found:
                methods[node.name] = found
    return functions, methods


# ------------------------------------------------------------------ stand-ins

@dataclasses.dataclass
class Config:
    """The settings SGLang's bookkeeping reads, in one place: the server args
    (``get_global_server_args()``, ``get_server_args()``) and the runtime
    context's bags (``get_spec()``, ``get_schedule()``, ``get_parallel()``)."""

    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    page_size: int = 1
    attn_dcp_size: int = 1
    enable_overlap: bool = False

    @property
    def max_speculative_num_draft_tokens(self) -> int | None:
        return self.speculative_num_draft_tokens


class SpeculativeAlgorithm:
    """Stands in for ``sglang.srt.speculative.spec_info.SpeculativeAlgorithm``."""

    def __init__(self, name: str | None) -> None:
        self.name = None if name is None else str(name).upper()

    @classmethod
    def from_string(cls, name: str | None) -> SpeculativeAlgorithm:
        return cls(name)

    def is_none(self) -> bool:
        return self.name is None

    def is_some(self) -> bool:
        return self.name is not None

    def is_uno(self) -> bool:
        return self.name == "UNO"

    def has_draft_kv(self) -> bool:
        return self.name not in (None, "NGRAM")

    def supports_spec_v2(self) -> bool:
        return self.name is not None


@dataclasses.dataclass
class Allocator:
    page_size: int


class StandinTree:
    """Stand-in ``sglang.*`` modules built from a :class:`SourceTree`.

    ``modules`` maps sglang's module names to the stand-ins; ``config`` is the
    settings object every upstream function reads (set its fields, or assign a
    new :class:`Config`); ``batch(reqs, page_size, algorithm=None, overlap=False)``
    makes a ``ScheduleBatch`` of the stand-in class, whose estimator methods are
    the release's own.  Use :func:`standin_tree` to register the modules.
    """

    def __init__(self, source: SourceTree, *, torch: Any = None) -> None:
        self.source = source
        self.version = source.version
        self.config = Config()
        self.modules: dict[str, types.ModuleType] = {}
        self.torch = torch
        self._build()

    # The names upstream code reads from outside the functions taken out.
    def _context(self) -> dict[str, Any]:
        tree = self

        def get_global_server_args() -> Config:
            return tree.config

        def get_spec() -> Config:
            return tree.config

        def max_speculative_num_draft_tokens() -> int | None:
            return tree.config.max_speculative_num_draft_tokens

        names: dict[str, Any] = {
            "get_global_server_args": get_global_server_args,
            "get_server_args": get_global_server_args,
            "get_spec": get_spec,
            "get_schedule": get_spec,
            "get_parallel": get_spec,
            "max_speculative_num_draft_tokens": max_speculative_num_draft_tokens,
            "SpeculativeAlgorithm": SpeculativeAlgorithm,
            "logger": _Placeholder("logger"),
        }
        if self.torch is not None:
            names["torch"] = self.torch
        return names

    def _module(self, name: str, relpath: str | None = None, package: bool = False
                ) -> types.ModuleType:
        module = self.modules.get(name)
        if module is None:
            module = types.ModuleType(name)
            if relpath is not None:
                module.__file__ = str(self.source.path(relpath))
            if package:
                module.__path__ = []  # type: ignore[attr-defined]
            # As the import system gives every module: upstream code that
            # reaches a builtin must find it, and raise its own exceptions.
            module.__dict__["__builtins__"] = builtins
            module.__dict__.update(self._context())
            self.modules[name] = module
        return module

    def _load(self, relpath: str, names: tuple[str, ...]) -> types.ModuleType | None:
        """A stand-in for ``relpath`` holding the listed definitions it has."""
        if not self.source.exists(relpath):
            return None
        tree = self.source.tree(relpath)
        nodes = [n for n in (_find(tree, name) for name in names) if n is not None]
        if not nodes:
            return None
        module = self._module(_module_name(relpath), relpath)
        _compile_into(module.__dict__, nodes, str(self.source.path(relpath)), tree)
        return module

    def _build(self) -> None:
        functions, methods_wanted = _wanted()  # read now: a test may add a hot spot
        wanted = [*functions, registry.BATCH, *registry.INT32_CALLER_MODULES,
                  registry.SERVER_ARGS, registry.SPEC_INFO, registry.RUNTIME_CONTEXT]
        for name in wanted:
            parts = name.split(".")
            for depth in range(1, len(parts)):
                self._module(".".join(parts[:depth]), package=True)
        self.modules["sglang"].__version__ = self.version  # type: ignore[attr-defined]
        server_args = self._module(registry.SERVER_ARGS)
        server_args.ServerArgs = Config  # type: ignore[attr-defined]
        self._module(registry.SPEC_INFO).SpeculativeAlgorithm = (  # type: ignore[attr-defined]
            SpeculativeAlgorithm)
        self._module(registry.RUNTIME_CONTEXT)

        loaded = {name: module for name, module in
                  ((name, self._load(registry.module_file(name), names))
                   for name, names in functions.items()) if module is not None}
        common = loaded.get(registry.COMMON)
        if common is None:
            raise LookupError(f"{self.source}: no {registry.module_file(registry.COMMON)}")
        package = self.modules[registry.COMMON.rsplit(".", 1)[0]]
        for name in functions[registry.COMMON]:  # the helpers and hot spots loaded there
            if name in common.__dict__:
                setattr(package, name, common.__dict__[name])  # the package re-exports them
        self.alloc_modules = [loaded[m] for m in registry.ALLOC_SETTINGS_MODULES if m in loaded]

        # What the batch module imports from the others.
        batch_module = self._module(registry.BATCH, registry.module_file(registry.BATCH))
        for name in registry.HELPERS:
            batch_module.__dict__[name] = common.__dict__[name]
        for module in self.alloc_modules:
            for name in registry.ALLOC_SETTINGS:
                if name in module.__dict__ and name not in batch_module.__dict__:
                    batch_module.__dict__[name] = module.__dict__[name]
        relpath = registry.module_file(registry.BATCH)
        self._bind_imports(batch_module, relpath, loaded)
        cls_node = _find(self.source.tree(relpath), "ScheduleBatch")
        if not isinstance(cls_node, ast.ClassDef):
            raise LookupError(f"{self.source}: no ScheduleBatch in {relpath}")
        methods = [m for m in cls_node.body
                   if isinstance(m, ast.FunctionDef) and m.name in methods_wanted]
        namespace: dict[str, Any] = {}
        scratch = dict(batch_module.__dict__)
        _compile_into(scratch, methods, str(self.source.path(relpath)),
                      self.source.tree(relpath))
        for method in methods:
            namespace[method.name] = scratch[method.name]
        # The methods' globals are the module's dict: point them there.
        for name, fn in list(namespace.items()):
            namespace[name] = _rehome(fn, batch_module.__dict__)
        namespace["__init__"] = _batch_init
        namespace["__module__"] = batch_module.__name__
        batch_module.ScheduleBatch = type("ScheduleBatch", (), namespace)  # type: ignore[attr-defined]

        alloc_fn = self.alloc_function("page_aligned_decode_alloc_lens")
        if alloc_fn is not None:
            for module in registry.INT32_CALLER_MODULES:
                self._load_callers(registry.module_file(module),
                                   "page_aligned_decode_alloc_lens", alloc_fn)

    def _bind_imports(self, module: types.ModuleType, relpath: str,
                      loaded: dict[str, types.ModuleType]) -> None:
        """What ``module``'s file imports by name (``from X import f``) from the
        functions loaded into the stand-ins: the hot spots it calls (as the
        batch module calls ``num_beam_member_rows``), bound as the import binds them."""
        from kvest.sglang.rewrite import module_imports

        for node in module_imports(self.source.tree(relpath)):
            home = loaded.get(node.module or "") if isinstance(node, ast.ImportFrom) else None
            for alias in getattr(node, "names", []) if home is not None else []:
                value = home.__dict__.get(alias.name)  # type: ignore[union-attr]
                if isinstance(value, types.FunctionType):
                    module.__dict__.setdefault(alias.asname or alias.name, value)

    def _load_callers(self, relpath: str, name: str, fn: Any) -> None:
        if not self.source.exists(relpath):
            return
        functions, methods = _functions_using(self.source.tree(relpath), name)
        if not functions and not methods:
            return
        module = self._module(_module_name(relpath), relpath)
        module.__dict__[name] = fn  # as ``from ... import name`` left it
        filename = str(self.source.path(relpath))
        _compile_into(module.__dict__, list(functions), filename, self.source.tree(relpath))
        for cls_name, found in methods.items():
            scratch = dict(module.__dict__)
            _compile_into(scratch, list(found), filename, self.source.tree(relpath))
            body = {m.name: _rehome(scratch[m.name], module.__dict__) for m in found}
            body["__module__"] = module.__name__
            module.__dict__[cls_name] = type(cls_name, (), body)

    # ----------------------------------------------------------- conveniences

    def alloc_function(self, name: str) -> Any:
        for module in self.alloc_modules:
            if name in module.__dict__:
                return module.__dict__[name]
        return None

    @property
    def batch_class(self) -> type:
        return self.modules[registry.BATCH].ScheduleBatch  # type: ignore[no-any-return]

    def batch(self, reqs: Any, page_size: int, algorithm: str | None = None,
              overlap: bool = False) -> Any:
        return self.batch_class(reqs, page_size, algorithm, overlap)

    def layout(self) -> dict[str, str]:
        """Where this release's estimator reads each length: ``"flat"`` or ``"nested"``."""
        relpath = registry.module_file(registry.BATCH)
        cls_node = _find(self.source.tree(relpath), "ScheduleBatch")
        found: dict[str, str] = {}
        for node in ast.walk(cls_node):  # type: ignore[arg-type]
            if isinstance(node, ast.Attribute) and node.attr in ("kv_committed_len",
                                                                 "kv_allocated_len"):
                nested = isinstance(node.value, ast.Attribute) and node.value.attr == "kv"
                found.setdefault(node.attr, "nested" if nested else "flat")
        return found

    def has(self, what: str) -> bool:
        """Feature probes the doctor and the tests use to pick what to exercise."""
        if what == "beam_rows":
            batch_module = self.modules[registry.BATCH]
            return "num_beam_member_rows" in batch_module.__dict__
        if what == "spec_v1":
            return "is_spec_v2" in vars(self.batch_class)
        if what == "alloc_lens":
            return self.alloc_function("page_aligned_decode_alloc_lens") is not None
        raise ValueError(what)


def _rehome(fn: Any, namespace: dict[str, Any]) -> Any:
    """``fn`` (a function or property) with ``namespace`` as its globals."""
    if isinstance(fn, property):
        return property(_rehome(fn.fget, namespace))
    if isinstance(fn, types.FunctionType):
        new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        new.__doc__ = fn.__doc__
        return new
    return fn


def _batch_init(self: Any, reqs: Any, page_size: int, algorithm: str | None,
                overlap: bool) -> None:
    self.reqs = reqs
    self.token_to_kv_pool_allocator = Allocator(page_size)
    self.spec_algorithm = SpeculativeAlgorithm(algorithm)
    self.enable_overlap = overlap


@contextlib.contextmanager
def standin_tree(source: SourceTree, *, torch: Any = None, plugins: bool = False
                 ) -> Iterator[StandinTree]:
    """Register a fresh :class:`StandinTree` under sglang's module names.

    Whatever ``sglang*`` modules were in ``sys.modules`` are set aside and put
    back afterwards.  With ``plugins=True`` the release's own plugin framework
    (``sglang/srt/plugins/__init__.py`` and ``hook_registry.py``, which import
    only the standard library and ``sglang.srt.environ.envs``) is loaded from
    its files too, with a stand-in ``envs`` that reads the environment.
    """
    standins = StandinTree(source, torch=torch)
    saved = {name: mod for name, mod in sys.modules.items()
             if name == "sglang" or name.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    from kvest.sglang.audit import kept

    try:
        sys.modules.update(standins.modules)
        if plugins:
            _load_plugin_framework(standins)
        with kept():  # (the plugin may audit the stand-in classes: not after them)
            yield standins
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class _EnvStr:
    def __init__(self, name: str) -> None:
        self.name = name

    def get(self) -> str:
        import os

        return os.environ.get(self.name, "")


def _load_plugin_framework(standins: StandinTree) -> None:
    environ = types.ModuleType(registry.ENVIRON)
    environ.envs = types.SimpleNamespace(  # type: ignore[attr-defined]
        SGLANG_PLUGINS=_EnvStr("SGLANG_PLUGINS"), SGLANG_PLATFORM=_EnvStr("SGLANG_PLATFORM"))
    sys.modules[registry.ENVIRON] = environ
    standins.modules[registry.ENVIRON] = environ
    init = standins.source.path(registry.module_file(f"{registry.PLUGINS}.__init__"))
    if not init.is_file():
        raise LookupError(f"{standins.source}: no plugin framework")
    spec = importlib.util.spec_from_file_location(
        registry.PLUGINS, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[registry.PLUGINS] = module
    standins.modules[registry.PLUGINS] = module
    spec.loader.exec_module(module)
    standins.modules[registry.HOOK_REGISTRY] = sys.modules[registry.HOOK_REGISTRY]
