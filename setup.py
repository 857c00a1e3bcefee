"""Build script: maps the project folders onto the `radixserve.*` import names
(docs/architecture.md, "Repository layout")."""

from __future__ import annotations

import os

from setuptools import setup

# Import name -> folder. `radixserve` itself is a namespace package shared with radixserve-client.
PACKAGE_ROOTS = {
    "radixserve.engine": "engine",
    "radixserve.services": "services",
    "radixserve.bench": "bench",
    "radixserve.native": "native",
    "radixserve.internal": "protos/gen/radixserve/internal",
}


def find_packages() -> list[str]:
    packages = []
    for name, root in PACKAGE_ROOTS.items():
        for folder, _, files in os.walk(root):
            if "__init__.py" in files:
                rel = os.path.relpath(folder, root)
                packages.append(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    return packages


setup(
    packages=find_packages(),
    package_dir=PACKAGE_ROOTS,
    cffi_modules=["native/build.py:ffibuilder"],
)
