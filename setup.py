"""The packages, found rather than listed: ``callbacks/`` installs as ``tensorplay.callbacks``.

``pyproject.toml``'s ``packages.find`` cannot rename a folder, so the discovery lives here; the
rest of the metadata stays in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

CALLBACKS = "tensorplay.callbacks"

setup(
    packages=find_packages(include=["tensorplay", "tensorplay.*"])
    + [
        CALLBACKS + name.removeprefix("callbacks")
        for name in find_packages(include=["callbacks", "callbacks.*"])
    ],
    package_dir={"tensorplay": "tensorplay", CALLBACKS: "callbacks"},
)
