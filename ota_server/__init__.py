"""OTA model server (``edgesdk.ota_server``); needs the ``[server]`` extra.

Installed into the ``edgesdk`` namespace by pyproject.toml's ``package-dir`` mapping.
Filled in by the OTA work.
"""
