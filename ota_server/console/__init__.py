"""The operator console: the fleet, rollouts, models and their health in a browser, at ``/ui`` on the admin address.

Enabled with ``edgesdk server --ui`` (``ServerSetup(console=True)``); without it nothing here is
imported. See :mod:`.app` for the pages and how each is protected, :mod:`.views` for what they
read, :mod:`.session` for the login cookie and CSRF tokens, :mod:`.forms` for capped form bodies
(trusted proxies and wrong-token lockouts are :mod:`edgesdk.ota_server.admin.client_guard`, shared
with the admin API), and :mod:`.details` for a device's reported details typed whatever it sent.
"""

from .app import PREFIX, create_console

__all__ = ["PREFIX", "create_console"]
