"""Front-end assets of the notebook widgets (anywidget ESM and CSS, no build step).

Shipped inside the package as ``streamling.widgets`` (see setup.py), so they are read with
``importlib.resources`` in a wheel and in an editable install alike.
"""
