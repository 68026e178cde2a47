"""Import contracts: the domain never imports its doors, and the device side never imports the cloud.

Read from the source with ``ast``, without importing anything: every import statement counts,
lazy ones inside functions included, and ``from registry import tasks`` counts as importing
``registry.tasks``. A failure lists each offending file, line and module.

- Domain modules (platform/*/services.py, selectors.py, models.py, the domain apps' errors.py,
  ferry_cloud/errors.py and events.py) import no door: no REST (rest_framework, drf_spectacular,
  ferry_cloud.api_errors, any ``*.api``), no gRPC (grpc, gateway, deploy.proto), no console, no
  Celery (celery, kombu, any ``*.tasks``), nothing HTTP from Django. Doors reach the domain, and
  the domain reaches doors only through ports they register at app ready (ferry_cloud.events).
- ferry_cloud/errors.py imports nothing but the standard library.
- engine/ and deploy/ import nothing of ours outside themselves; agent/ imports no control plane
  and no converter; converter/ imports no control plane and no agent.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = ROOT / "platform"
PLATFORM_APPS = frozenset(p.name for p in PLATFORM.iterdir() if (p / "__init__.py").is_file())
OURS = PLATFORM_APPS | {"agent", "converter", "deploy", "engine", "ferryctl"}
DOOR_APPS = frozenset({"gateway", "console"})

DOOR_PACKAGES = (
    "rest_framework",
    "drf_spectacular",
    "grpc",
    "grpc_health",
    "celery",
    "kombu",
    "gateway",
    "console",
    "deploy.proto",
    "ferry_cloud.api_errors",
    "ferry_cloud.celery",
    "ferry_cloud.urls",
    "django.http",
    "django.shortcuts",
    "django.views",
    "django.contrib.messages",
)
DOOR_MODULE_NAMES = ("api", "tasks")  # registry.tasks, accounts.api, ...

# Imports the contract forbids but that are known and owned elsewhere, each with its way out.
# The last test fails once one is gone, so the list cannot go stale.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.module}"


def _module_of(path: Path) -> str:
    base = PLATFORM if path.is_relative_to(PLATFORM) else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def imports_of(path: Path) -> list[Import]:
    """Every module the file imports, at any depth; ``from a import b`` yields a and a.b."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(path, node)
            found.append(Import(path, node.lineno, base))
            found += [Import(path, node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif _is_import_call(node):
            found.append(Import(path, node.lineno, node.args[0].value))
    return found


def _is_import_call(node: ast.AST) -> bool:
    """importlib.import_module("x") or __import__("x") with a literal name."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    first = node.args[0]
    return (
        name in ("import_module", "__import__")
        and isinstance(first, ast.Constant)
        and isinstance(first.value, str)
    )


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _domain_modules() -> list[Path]:
    files = [PLATFORM / "ferry_cloud" / "errors.py", PLATFORM / "ferry_cloud" / "events.py"]
    for app in sorted(PLATFORM_APPS):
        names = ["services.py", "selectors.py", "models.py"]
        if app not in DOOR_APPS:
            names.append("errors.py")
        files += [PLATFORM / app / name for name in names if (PLATFORM / app / name).is_file()]
    return files


def door_imports(path: Path) -> list[Import]:
    own_app = _module_of(path).split(".")[0]
    return [
        imp
        for imp in imports_of(path)
        if (any(_within(imp.module, door) for door in DOOR_PACKAGES) and _top(imp.module) != own_app)
        or (_top(imp.module) in OURS and imp.module.rsplit(".", 1)[-1] in DOOR_MODULE_NAMES)
    ]


def outside_imports(path: Path, forbidden: frozenset[str]) -> list[Import]:
    rel = str(path.relative_to(ROOT))
    return [
        imp
        for imp in imports_of(path)
        if _top(imp.module) in forbidden
        and not any(file == rel and _within(imp.module, pkg) for file, pkg in KNOWN_EXCEPTIONS)
    ]


def _report(violations: list[Import]) -> str:
    """One line per import statement (``from a import b`` matches as a and as a.b)."""
    first: dict[tuple[Path, int], Import] = {}
    for v in violations:
        first.setdefault((v.path, v.line), v)
    return "\n".join(v.where() for v in first.values())


def test_the_domain_imports_no_door():
    modules = _domain_modules()
    assert len(modules) >= 15, "the domain modules were not found; did platform/ move?"
    violations = [v for path in modules for v in door_imports(path)]
    assert not violations, "domain modules import a door:\n" + _report(violations)


def test_domain_errors_import_only_the_standard_library():
    path = PLATFORM / "ferry_cloud" / "errors.py"
    foreign = [
        imp for imp in imports_of(path) if _top(imp.module) not in sys.stdlib_module_names | {"__future__"}
    ]
    assert not foreign, _report(foreign)


# (folder, the top-level packages of ours it must not import)
SIDES = [
    ("engine", OURS - {"engine"}),
    ("deploy", OURS - {"deploy"}),
    ("agent", PLATFORM_APPS | {"converter"}),
    ("converter", PLATFORM_APPS | {"agent"}),
    ("ferryctl", OURS - {"ferryctl"}),  # a REST client: all it knows comes over HTTP
]


@pytest.mark.parametrize(("folder", "forbidden"), SIDES, ids=[s[0] for s in SIDES])
def test_each_side_imports_only_what_it_may(folder: str, forbidden: frozenset[str]):
    files = _python_files(ROOT / folder)
    assert files, f"no Python files under {folder}/"
    violations = [v for path in files for v in outside_imports(path, forbidden)]
    assert not violations, f"{folder}/ imports what it must not:\n" + _report(violations)


def test_the_checker_sees_lazy_relative_and_from_imports(tmp_path, monkeypatch):
    """The contract is only as good as its reader: every way of importing a door is caught."""
    app = tmp_path / "platform" / "registry"
    app.mkdir(parents=True)
    (app / "__init__.py").write_text("")
    services = app / "services.py"
    services.write_text(
        "import importlib\n"
        "from registry import tasks\n"
        "from . import api\n"
        "def later():\n"
        "    from rest_framework.authtoken.models import Token\n"
        "    import grpc\n"
        "    importlib.import_module('gateway.hints')\n"
        "from ferry_cloud.errors import NotFound\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PLATFORM", tmp_path / "platform")
    caught = {v.module for v in door_imports(services)}
    expected = {"registry.tasks", "registry.api", "rest_framework.authtoken.models", "grpc", "gateway.hints"}
    assert expected <= caught
    assert not any(m.startswith("ferry_cloud.errors") for m in caught)


def test_known_exceptions_are_still_needed():
    for (file, package), why in KNOWN_EXCEPTIONS.items():
        path = ROOT / file
        still = path.is_file() and any(_within(imp.module, package) for imp in imports_of(path))
        assert still, f"{file} no longer imports {package}: drop its exception ({why})"
