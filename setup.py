"""Package layout that pyproject.toml cannot say: the top-level ``schemas/`` folder ships inside
the wheel as the data package ``pipeline.schemas``.

The design card fixes ``schemas/`` at the top level (other tools read it there), yet an installed
``pipe`` must find the schemas without the repository, so the wheel maps the folder into the
package. Everything else (name, version, dependencies, the ``pipe`` script) is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["pipeline*", "train*"]) + ["pipeline.schemas"],
    package_dir={"pipeline.schemas": "schemas"},
    package_data={"pipeline": ["py.typed"], "train": ["py.typed"], "pipeline.schemas": ["*.json", "README.md"]},
)
