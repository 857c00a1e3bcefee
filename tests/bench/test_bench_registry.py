"""`radixserve bench NAME` resolves through radixserve.bench.BENCHMARKS alone: every name there is a
module with main(), every module with main() is named there, an unknown name lists them, and the
product never imports the benchmarks (the CLI's dispatch aside)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from radixserve.bench import BENCHMARKS
from radixserve.services.cli import main

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def test_every_benchmark_module_is_registered_by_its_file_name() -> None:
    with_main = {p.stem for p in BENCH.glob("*.py")
                 if any(isinstance(n, ast.FunctionDef) and n.name == "main"
                        for n in ast.parse(p.read_text()).body)}
    assert with_main == set(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_help_of_each_benchmark(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(importlib.import_module(f"radixserve.bench.{name}").main)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", name, "--help"])
    assert exit_.value.code == 0
    assert f"radixserve bench {name}" in capsys.readouterr().out


def test_unknown_name_lists_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark named 'nosuch'" in err
    assert all(f"  {name} " in err for name in BENCHMARKS)
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in BENCHMARKS)


def test_product_does_not_import_the_benchmarks() -> None:
    allowed = {ROOT / "services" / "cli.py"}  # the dispatch of `radixserve bench`
    for top in ("engine", "services", "native", "clients"):
        for path in (ROOT / top).rglob("*.py"):
            if {".venv", "build", "node_modules"} & set(path.parts) or path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n == "radixserve.bench" or n.startswith("radixserve.bench.")
                               for n in names), path


def test_engine_overrides_are_typed_and_checked():
    """`--engine FIELD=VALUE` reaches every engine a benchmark builds, typed as the field needs;
    a misspelt field is refused instead of silently benchmarking the default."""
    from radixserve.bench.driver import parse_engine_overrides

    got = parse_engine_overrides(["piecewise_graph_max_tokens=0", "attention-backend=fa,flashinfer",
                                  "overlap=false", "memory_fraction=0.5", "num_pages=none"])
    assert got == {"piecewise_graph_max_tokens": 0, "attention_backend": "fa,flashinfer",
                   "overlap": False, "memory_fraction": 0.5, "num_pages": None}
    for bad in ("piecewise_graphs=0", "overlap"):
        with pytest.raises(ValueError, match="FIELD=VALUE"):
            parse_engine_overrides([bad])
