"""A stand-in ``torchvision`` for running SGLang's scheduler on CPU-only machines.

Why: the torchvision wheels reachable here are CUDA builds that fail at import
(``operator torchvision::nms does not exist``) next to the CPU torch build, yet
SGLang imports torchvision at module level for multimodal code paths that the
scheduler's KV bookkeeping never runs.  ``install()`` puts a meta-path finder at
the front of ``sys.meta_path`` that serves ``torchvision`` and every
``torchvision.*`` submodule from this file:

* every public attribute of a stand-in module resolves to an inert placeholder
  *class*: attribute chains, calls (which make inert instances), subclassing,
  ``isinstance`` checks, ``X[...]`` and ``X | None`` annotations all work and
  do nothing;
* ``torchvision.transforms.InterpolationMode`` (also re-exported where the
  real package re-exports it) is a real ``enum.Enum`` with the real members
  and values, because code compares against and indexes it at import time;
* dunder lookups raise ``AttributeError`` as on a normal module, so
  ``hasattr(mod, "__path__")``-style probing behaves.

Nothing here imports torch, so importing this module from a ``.pth`` file at
interpreter start-up costs microseconds.

Use:
    import torchvision_standin; torchvision_standin.install()   # before sglang
or let a ``.pth`` file in site-packages do it for every process of the venv
(``make_sglang_env.sh`` writes one).  Set ``TORCHVISION_STANDIN=0`` in the
environment to make ``install()`` a no-op (e.g. to try a real torchvision).
"""

from __future__ import annotations

import enum
import importlib.machinery
import os
import sys
import types

__all__ = ["STANDIN_VERSION", "InterpolationMode", "install", "is_installed", "uninstall"]

ROOT = "torchvision"
# Reported as torchvision.__version__; the "+standin" local tag makes it obvious
# in any log line that prints library versions.
STANDIN_VERSION = "0.0.0+standin"


class InterpolationMode(enum.Enum):
    """Same members and values as ``torchvision.transforms.InterpolationMode``."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


# Modules of the real package that expose InterpolationMode.
_INTERPOLATION_MODE_HOMES = {
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
}


class _PlaceholderMeta(type):
    """Metaclass of placeholders: a placeholder is a class, so it can be called,
    subclassed, used with isinstance and in annotations; unknown attributes of it
    are further placeholders."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}", cls.__module__)

    def __getitem__(cls, item):  # Generic-style subscription: X[int]
        return cls

    def __repr__(cls) -> str:
        return f"<torchvision stand-in placeholder {cls.__module__}.{cls.__qualname__}>"


class _PlaceholderBase(metaclass=_PlaceholderMeta):
    """Instances are as inert as the classes: they accept any arguments."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{type(self).__qualname__}().{name}", type(self).__module__)

    def __call__(self, *args, **kwargs):
        return type(self)()


def _placeholder(qualname: str, module: str) -> type:
    name = qualname.rsplit(".", 1)[-1]
    namespace = {"__qualname__": qualname, "__module__": module}
    return _PlaceholderMeta(name, (_PlaceholderBase,), namespace)


class _StandinModule(types.ModuleType):
    """A stand-in (sub)package: public attributes not set explicitly are placeholders
    (cached, so ``m.X is m.X``)."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = _placeholder(name, self.__name__)
        setattr(self, name, value)
        return value


class _StandinFinder:
    """Serves ``torchvision`` and all ``torchvision.*`` names as stand-in packages.

    A plain class implementing the finder and loader protocols: subclassing the
    ``importlib.abc`` ABCs would add ~20 ms to every interpreter start via the .pth."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != ROOT and not fullname.startswith(ROOT + "."):
            return None
        # is_package=True gives every stand-in a __path__, so any submodule import works.
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandinModule(spec.name)

    def exec_module(self, module):
        module.__dict__["__file__"] = __file__
        module.__dict__["__torchvision_standin__"] = True
        if module.__name__ == ROOT:
            module.__dict__["__version__"] = STANDIN_VERSION
            module.__dict__["version"] = types.SimpleNamespace(
                __version__=STANDIN_VERSION, cuda=None)
        if module.__name__ in _INTERPOLATION_MODE_HOMES:
            module.__dict__["InterpolationMode"] = InterpolationMode


_FINDER = _StandinFinder()


def is_installed() -> bool:
    return _FINDER in sys.meta_path


def install(force: bool = False) -> bool:
    """Put the stand-in finder first on ``sys.meta_path``; idempotent.

    Returns True when the stand-in is active.  Does nothing (returns False) when
    ``TORCHVISION_STANDIN=0`` and not ``force``.  Raises RuntimeError if a real
    ``torchvision`` was already imported, since the stand-in could no longer take
    its place.
    """
    if not force and os.environ.get("TORCHVISION_STANDIN", "1") == "0":
        return False
    loaded = sys.modules.get(ROOT)
    if loaded is not None and not getattr(loaded, "__torchvision_standin__", False):
        raise RuntimeError("a real torchvision is already imported; install the stand-in first")
    if not is_installed():
        sys.meta_path.insert(0, _FINDER)
    return True


def uninstall() -> None:
    """Remove the finder and forget any stand-in modules already imported."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == ROOT or n.startswith(ROOT + ".")]:
        if getattr(sys.modules[name], "__torchvision_standin__", False):
            del sys.modules[name]
