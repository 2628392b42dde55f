"""Only what pyproject.toml cannot say: stamp the git revision into a built wheel.

An installed wheel has no repository to ask, so ``xbench --version`` reads the revision the
build saw from ``xbench/_build_revision.txt`` (``xbench.version``).
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _revision() -> str:
    # xbench/version.py by path: the build must not import the package (or its dependencies)
    spec = importlib.util.spec_from_file_location("_xbench_version", ROOT / "xbench" / "version.py")
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    return version.checkout_revision(ROOT) or ""


class BuildWithRevision(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "xbench" / "_build_revision.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_revision() + "\n")


setup(cmdclass={"build_py": BuildWithRevision})
