"""Layout rules of the package: every module declares its public names, and no module reaches
into another module's private names (package ``__init__`` files excepted: they keep the old
import paths of split modules working)."""

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = sorted(p for p in (ROOT / "dp_beam").rglob("*.py"))


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_imports(path):
    """``(line, module, name)`` of every ``from dp_beam… import _name`` (absolute or relative)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        internal = node.level > 0 or (node.module or "").split(".")[0] == "dp_beam"
        if not internal:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append((node.lineno, node.module, alias.name))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_declares_existing_public_names(path):
    module = importlib.import_module(_module_name(path))
    assert hasattr(module, "__all__"), f"{path.name} has no __all__"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{path.name}: __all__ names {missing} that it does not define"


@pytest.mark.parametrize("path", [p for p in MODULES if p.name != "__init__.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_private_names_of_another(path):
    assert _private_imports(path) == []


def test_the_private_import_check_sees_relative_and_absolute_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from .stream import (Public,\n    _Hidden)\nfrom dp_beam.records import _x\n"
                      "from os import _exit\nfrom __future__ import annotations\n")
    assert _private_imports(sample) == [(1, "stream", "_Hidden"), (3, "dp_beam.records", "_x")]
