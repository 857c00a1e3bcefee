"""Source gates: line budgets (docs/conventions.md #3, the one checker in tools/line_budget.py), one
protobuf seam per service (docs/conventions.md #2), and no unsafe deserialization in any shipped
source: engine/, services/, native/, clients/ (docs/reliability.md #27); no torch in the services
that hold no model."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_line_budget():
    spec = importlib.util.spec_from_file_location("line_budget", ROOT / "tools" / "line_budget.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


line_budget = _load_line_budget()


@pytest.mark.parametrize("path", line_budget.sources(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_line_budget(path: Path) -> None:
    budget = line_budget.budget(path, ROOT)
    assert line_budget.code_lines(path) <= budget, f"{path} is over its {budget}-line budget"


def test_line_budget_rules() -> None:
    assert line_budget.budget(ROOT / "services" / "gateway" / "server.py", ROOT) == 450
    assert line_budget.budget(ROOT / "services" / "gateway" / "links.py", ROOT) == 300
    assert line_budget.budget(ROOT / "engine" / "core.py", ROOT) == 300
    assert line_budget.budget(ROOT / "bench" / "anything.py", ROOT) == 450
    assert not line_budget.over_budget(ROOT)


def _message_modules(tree: ast.Module) -> set[str]:
    """Names a module binds to generated message modules (`*_pb2`; stubs, `*_pb2_grpc`, are
    transport and not counted)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.endswith("_pb2") or (node.module or "").endswith("_pb2"):
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name.endswith("_pb2")}
    return names


@pytest.mark.parametrize("service", ["gateway", "scheduler", "tokenizer", "detokenizer"])
def test_protobuf_meets_domain_types_only_in_convert(service: str) -> None:
    """Each service's convert.py is its one seam: no other module imports a message module,
    except server.py, whose servicer signatures name the messages; it builds none itself."""
    for path in sorted((ROOT / "services" / service).glob("*.py")):
        if path.name == "convert.py":
            continue
        tree = ast.parse(path.read_text())
        modules = _message_modules(tree)
        if path.name != "server.py":
            assert not modules, f"{path.relative_to(ROOT)} imports {sorted(modules)}"
            continue
        built = [
            f"line {node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in modules
        ]
        assert not built, f"{path.relative_to(ROOT)} builds messages itself: {built}"


GATED = ("engine", "services", "native", "clients")  # everything that ships
UNSAFE = re.compile(
    r"\b(pickle|cPickle|dill|recv_pyobj|shelve)\b"  # object deserialization over IPC or files
    r"|\bmarshal\.loads?\b"
    r"|(?<![.\w])eval\("  # eval() itself; model.eval() and other methods are fine
    r"|(?<![.\w])exec\("
    r"|\btorch\.load\((?![^)]*weights_only\s*=\s*True)"  # only with weights_only=True
)


def _shipped_sources() -> list[Path]:
    files = []
    for top in GATED:
        for path in (ROOT / top).rglob("*"):
            skip = {"node_modules", "__pycache__", "build", ".venv"} & set(path.parts)
            if path.suffix in (".py", ".pyx", ".js") and not skip and path.is_file():
                files.append(path)
    return files


def test_no_unsafe_deserialization_anywhere() -> None:
    """docs/reliability.md #27: protobuf only on every wire and in every file the engine reads."""
    files = _shipped_sources()
    assert len(files) > 50, "the gate found too few files to be looking in the right place"
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if UNSAFE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("line", [
    "import pickle", "obj = sock.recv_pyobj()", "marshal.loads(b)", "eval(text)",
    "torch.load(path)", "torch.load(path, weights_only=False)",
])
def test_unsafe_gate_catches(line: str) -> None:
    assert UNSAFE.search(line)


@pytest.mark.parametrize("line", ["model.eval()", "torch.load(path, weights_only=True)"])
def test_unsafe_gate_allows(line: str) -> None:
    assert not UNSAFE.search(line)


@pytest.mark.parametrize("module", ["radixserve.services.cli", "radixserve.services.gateway.server",
                                    "radixserve.services.tokenizer.server",
                                    "radixserve.services.detokenizer.server"])
def test_services_without_a_model_import_no_torch(module: str) -> None:
    """The gateway, tokenizer and detokenizer (and the command line that starts every service)
    never load torch: it would take seconds to import and some 190 MiB of each one's memory."""
    import subprocess
    import sys

    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
