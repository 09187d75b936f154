"""The one build step pyproject.toml cannot say: the example vault ships in the package.

``examples/vault`` stays where the docs and tests name it; building copies it into the wheel
as ``kbgraph/example_vault``, where ``kbgraph.sources.demokb.example_vault`` finds it once installed
(MANIFEST.in puts it in the sdist, from which ``python -m build`` builds the wheel).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

VAULT = Path("examples") / "vault"
PACKAGED = Path("kbgraph") / "example_vault"  # kbgraph.sources.demokb.PACKAGED_VAULT


class BuildWithVault(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout's examples/vault
            target = Path(self.build_lib) / PACKAGED
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(VAULT, target)


setup(cmdclass={"build_py": BuildWithVault})
