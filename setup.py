"""What pyproject.toml cannot say: the notebook widgets' front end lives in the top-level widgets/
folder (no build step) and ships inside the package as ``streamling.widgets``; the JupyterLab
extension in widgets/labextension goes where JupyterLab looks for prebuilt extensions, and
widgets/jupyterlab-settings/streamling.json into JupyterLab's per-package setting overrides (it turns
on saving widget state, so a saved notebook reopens with its monitor as it was)."""

from glob import glob

from setuptools import find_namespace_packages, setup

LABEXTENSION = "share/jupyter/labextensions/streamling-magics"
LAB_OVERRIDES = "share/jupyter/lab/settings/overrides.d"

setup(
    packages=[*find_namespace_packages("src", include=["streamling*"]), "streamling.widgets"],
    package_dir={"": "src", "streamling.widgets": "widgets"},
    # Package data is what pyproject.toml lists, no more: the extension is installed once, under share/.
    include_package_data=False,
    data_files=[(LABEXTENSION, ["widgets/labextension/package.json", "widgets/labextension/install.json"]),
                (f"{LABEXTENSION}/static", glob("widgets/labextension/static/*.js")),
                (LAB_OVERRIDES, ["widgets/jupyterlab-settings/streamling.json"])],
)
