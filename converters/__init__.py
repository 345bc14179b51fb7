"""Model conversion and quantization (``edgesdk.converters``); needs the ``[convert]`` extra.

Installed into the ``edgesdk`` namespace by pyproject.toml's ``package-dir`` mapping, so
users write ``from edgesdk.converters import ...``. Filled in by the converter work.
"""
