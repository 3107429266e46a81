"""What pyproject.toml cannot say: the notebook widgets' front end lives in the top-level widgets/
folder (no build step) and ships inside the package as ``streamling.widgets``."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages("src", include=["streamling*"]), "streamling.widgets"],
    package_dir={"": "src", "streamling.widgets": "widgets"},
)
