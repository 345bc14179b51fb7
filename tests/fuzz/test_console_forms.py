"""Hypothesis over the console's input: any bytes as the body of any console form (and any Content-Length said for
it) get a 2xx, 3xx or 4xx, never a 5xx (the login, the logout and the rollout actions, with and without the
session's CSRF token); and any JSON a device puts in its details renders its device page and its rollout's page.

``EDGESDK_FUZZ_EXAMPLES`` sets the examples per property (200 by default). The app is called in-process over ASGI
(tests/ota/console_asgi.py), on a real FleetDB and repository.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk.ota_server.admin.client_guard import LoginLimiter
from edgesdk.ota_server.console.details import parse_details
from edgesdk.ota_server.console.forms import FORM_MAX_BYTES
from edgesdk.ota_server.store.fleet_db import DeviceState
from edgesdk.runtime.signing import generate_keypair, load_private_key, load_public_key
from tests.fuzz.hostile import EDGE_VALUES, json_values
from tests.ota.conftest import make_bundle
from tests.ota.console_asgi import TOKEN, AsgiConsole, console_server

PROFILE = settings(max_examples=int(os.environ.get("EDGESDK_FUZZ_EXAMPLES", "200")), deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Placeholders a drawn form may use for the real values (so some forms get past the CSRF check).
REAL = ("<csrf>", "<login>", "<token>")
_texts = st.one_of(st.sampled_from([*REAL, "yes", "", "1.0.0", "0.9.0"]), st.text(max_size=60),
                   st.builds(lambda real, extra: real + extra, st.sampled_from(REAL), st.text(max_size=3)),
                   st.sampled_from([v for v in EDGE_VALUES if isinstance(v, str)]))
_forms = st.builds(lambda known, other: {**other, **known},
                   st.fixed_dictionaries({}, optional={k: _texts for k in ("login", "token", "csrf", "confirm", "to")}),
                   st.dictionaries(st.text(max_size=8), _texts, max_size=3))
#: A body: raw bytes (some over the cap), or a urlencoded form with raw bytes after it, in one or more chunks.
_bodies = st.one_of(st.binary(max_size=FORM_MAX_BYTES + 200),
                    st.tuples(_forms, st.binary(max_size=40)))
_paths = st.one_of(st.sampled_from(["/ui/login", "/ui/logout", "<rollout>/promote", "<rollout>/abort",
                                    "<rollout>/rollback"]),
                   st.builds(lambda verb: "<rollout>/" + quote(verb, safe=""), st.text(min_size=1, max_size=20)),
                   st.builds(lambda rid: "/ui/rollouts/" + quote(rid, safe="") + "/abort", st.text(min_size=1,
                                                                                                 max_size=30)))


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console-forms")
    generate_keypair(folder, "server")
    generate_keypair(folder, "converter")
    keys = {"server": load_private_key(folder / "server.key"), "converter": load_private_key(folder / "converter.key"),
            "converter_pub": load_public_key(folder / "converter.pub")}
    bundle = make_bundle(folder / "bundle", "1.0.0", keys, seed=1)
    devices = {f"cam{i}": json.dumps({"runtime": {"count": i, "p99_ms": 10.0 + i}}) for i in range(3)}
    server, app, rollout = console_server(folder, keys, bundle, devices, limiter=LoginLimiter(free=10**9))
    return server, app, rollout


def _logged_in(browser: AsgiConsole) -> str:
    """The session's CSRF token, logging in again when a drawn logout ended the session."""
    page = browser.get("/ui/")
    if page.status != 200:
        assert browser.login().status == 303
        page = browser.get("/ui/")
    return browser.field(page, "csrf")


@PROFILE
@given(path=_paths, body=_bodies, chunk=st.integers(min_value=1, max_value=5000), logged_in=st.booleans(),
       content_type=st.sampled_from(["application/x-www-form-urlencoded", "multipart/form-data", "text/plain", ""]),
       length=st.one_of(st.none(), st.integers(min_value=0, max_value=10**40).map(str),
                        st.text(st.characters(max_codepoint=255), max_size=30)))
def test_any_body_on_any_console_form_gets_a_2xx_3xx_or_4xx_never_a_5xx(console, path, body, chunk, logged_in,
                                                                         content_type, length):
    server, app, rollout = console
    browser = AsgiConsole(app)
    csrf = _logged_in(browser) if logged_in else ""
    login = browser.field(browser.get("/ui/login"), "login")
    if isinstance(body, tuple):
        form, tail = body
        real = dict(zip(REAL, (csrf, login, TOKEN)))
        for placeholder, value in real.items():
            form = {k: v.replace(placeholder, value) for k, v in form.items()}
        body = urlencode(form).encode() + tail
    chunks = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    answer = browser.request("POST", path.replace("<rollout>", f"/ui/rollouts/{rollout}"), body=chunks,
                             headers=[("content-type", content_type), *([("content-length", length)] if length else [])])
    assert 200 <= answer.status < 500, (answer.status, answer.text[-800:])


@PROFILE
@given(details=json_values)
def test_any_details_a_device_reports_render_its_page_and_its_rollouts_page(console, details):
    server, app, rollout = console
    typed = parse_details(details)
    assert all(isinstance(v, int | float | str | type(None)) for v in vars(typed.runtime).values())
    server.db.upsert_devices([DeviceState("cam0", "cams", "online", "digits", "0.9.0", ("a",), 1.0,
                                          details=json.dumps(details))])
    browser = AsgiConsole(app)
    assert browser.login().status == 303
    for path in ("/ui/devices/cam0", f"/ui/rollouts/{rollout}", "/ui/"):
        answer = browser.get(path)
        assert answer.status == 200, (path, answer.text[-800:])
