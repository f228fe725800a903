"""Maps the top-level subsystem folders into the single ``inferline`` import namespace.

Kept in setup.py (not pyproject) because the package list is derived from the folders, so a new
subpackage is picked up without editing a list by hand.
"""

from setuptools import find_packages, setup

NAMESPACE = {
    "inferline": "inferline",
    "inferline.core": "core",
    "inferline.queueing": "queueing",
    "inferline.selection": "selection",
    "inferline.velox": "velox",
    "inferline.adapters": "adapters",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for pkg, folder in NAMESPACE.items():
    package_dir[pkg] = folder
    packages.append(pkg)
    packages += [f"{pkg}.{sub}" for sub in find_packages(folder, exclude=["tests*"])]

setup(packages=packages, package_dir=package_dir)
