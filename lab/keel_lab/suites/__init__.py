"""Benchmark suites. Each module defines Suite subclasses; REGISTRY maps name -> class.

Modules are imported one by one: a module that fails to import (not written yet, a
syntax error, a missing dependency) does not break the CLI; its suites are listed in
UNAVAILABLE with the error, and `keel bench` reports it when asked for one of them.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import traceback

from .base import Suite, SuiteContext, SuiteError  # noqa: F401

# Modules expected to exist (others in this package are found by themselves), each with
# the suite names it is expected to provide, for the "unavailable" list.
MODULES = {
    "micro": ("micro",),
    "threads": ("threads",),
    "redis": ("redis",),
    "mariadb": ("mariadb", "mariadb-pool"),
    "postgres": ("postgres",),
    "sphinx": ("sphinx",),
}

REGISTRY: dict[str, type[Suite]] = {}
UNAVAILABLE: dict[str, str] = {}   # suite (or module) name -> why it cannot be used


def _modules() -> dict[str, tuple[str, ...]]:
    """The expected modules plus every other module in this package."""
    found = {m.name: (m.name,) for m in pkgutil.iter_modules(__path__)
             if m.name != "base" and not m.name.startswith("_")}
    return {**found, **MODULES}


def _load() -> None:
    for mod_name, expected in _modules().items():
        try:
            mod = importlib.import_module(f"{__name__}.{mod_name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{mod_name}":
                why = f"keel_lab/suites/{mod_name}.py does not exist (not written yet?)"
            else:
                why = (f"keel_lab.suites.{mod_name} failed to import: it needs the module "
                       f"{e.name}, which is missing")
            for name in expected:
                UNAVAILABLE[name] = why
            continue
        except Exception as e:  # noqa: BLE001 -- any import failure makes the suite unavailable
            last = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" ({last.filename}:{last.lineno})" if last else ""
            why = f"keel_lab.suites.{mod_name} failed to import: {type(e).__name__}: {e}{where}"
            for name in expected:
                UNAVAILABLE[name] = why
            continue
        found = False
        for _n, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, Suite) and obj is not Suite and obj.name and \
                    obj.__module__ == mod.__name__:
                REGISTRY[obj.name] = obj
                found = True
        if not found:
            for name in expected:
                UNAVAILABLE[name] = f"keel_lab.suites.{mod_name} defines no Suite subclass"
    for name in list(UNAVAILABLE):
        if name in REGISTRY:
            del UNAVAILABLE[name]


_load()


def unavailable_reason(name: str) -> str | None:
    """Why suite `name` cannot be used, if it belongs to a module that failed to import
    (by the module's name: "redis" also covers "redis-ops", "redis_frag", ...)."""
    if name in UNAVAILABLE:
        return UNAVAILABLE[name]
    for mod, why in UNAVAILABLE.items():
        if name.startswith(mod + "-") or name.startswith(mod + "_"):
            return why
    return None


def get(name: str) -> type[Suite]:
    """The suite class for name, or SuiteError saying why it is not available."""
    if name in REGISTRY:
        return REGISTRY[name]
    why = unavailable_reason(name)
    if why:
        raise SuiteError(f"suite {name} is not available: {why}")
    known = sorted(REGISTRY) + sorted(UNAVAILABLE)
    raise SuiteError(f"unknown suite {name!r} (known: {', '.join(known)})")
