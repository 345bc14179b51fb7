"""The console's front door and its pages under hostile input: Secure cookies over HTTPS (and only a trusted proxy
may say so), wrong-token lockouts, form bodies capped before they are read, and pages that render whatever a device
put in its details."""

from __future__ import annotations

import itertools
import json
import re
import socket
from urllib.parse import quote

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server.admin.client_guard import LoginLimiter, Proxies
from edgesdk.ota_server.admin.http_api import HttpServer
from edgesdk.ota_server.broker import free_port
from edgesdk.ota_server.console.details import parse_details
from edgesdk.ota_server.console.forms import FORM_MAX_BYTES
from edgesdk.ota_server.console.session import COOKIE, LOGIN_COOKIE
from tests.ota.console_asgi import TOKEN, AsgiConsole, console_server

GOOD = {"runtime": {"count": 120, "errors": 1, "p50_ms": 21.5, "p99_ms": 48.25,
                    "paths": {"local": {"count": 90, "p99_ms": 47.0}, "cloud": {"count": 10}}, "breaker": "closed"},
        "disk": {"free_bytes": 3 * 1048576, "store_bytes": 1048576}, "previous": "0.8.0"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def console(tmp_path, keys, bundles):
    """Factory: ``console(devices=..., proxies=...)`` -> (server, app, rollout id, the limiter's clock)."""
    def make(devices: dict[str, str | None] | None = None, proxies: str = ""):
        clock = Clock()
        folder = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        server, app, rollout = console_server(folder, keys, bundles["1.0.0"], devices or {"cam0": json.dumps(GOOD)},
                                              proxies=proxies, limiter=LoginLimiter(clock=clock))
        return server, app, rollout, clock
    return make


def _secure(answer, name: str) -> bool:
    line = answer.cookies()[name]
    return "secure" in [part.strip().lower() for part in line.split(";")]


def test_cookies_are_secure_over_https_and_behind_a_trusted_proxy_only(console):
    _, app, _, _ = console()
    browser = AsgiConsole(app, scheme="https")
    assert _secure(browser.get("/ui/login"), LOGIN_COOKIE)
    assert _secure(browser.login(), COOKIE)
    plain = AsgiConsole(app, scheme="http", client=("127.0.0.1", 40000))
    assert not _secure(plain.get("/ui/login"), LOGIN_COOKIE) and not _secure(plain.login(), COOKIE)
    # Nobody is trusted by default: a client saying it came over HTTPS is not believed, loopback included.
    forwarded = [("x-forwarded-proto", "https")]
    assert not _secure(plain.get("/ui/login", headers=forwarded), LOGIN_COOKIE)

    _, app, _, _ = console(proxies="10.0.0.0/8")
    proxied = AsgiConsole(app, client=("10.1.2.3", 50000))
    assert _secure(proxied.get("/ui/login", headers=forwarded), LOGIN_COOKIE)
    assert _secure(proxied.login(headers=forwarded), COOKIE)
    assert not _secure(proxied.get("/ui/login"), LOGIN_COOKIE)  # the proxy says plain http
    outsider = AsgiConsole(app, client=("198.51.100.7", 50000))
    assert not _secure(outsider.get("/ui/login", headers=forwarded), LOGIN_COOKIE)
    assert not _secure(outsider.login(headers=forwarded), COOKIE)
    logout = outsider.post("/ui/logout", {"csrf": outsider.field(outsider.get("/ui/"), "csrf")})
    assert logout.status == 303 and COOKIE not in outsider.jar


def test_the_sixth_wrong_token_locks_the_client_out_for_a_growing_time_and_a_right_one_after_it_works(console):
    server, app, _, clock = console()
    browser = AsgiConsole(app)
    for _ in range(5):
        assert browser.login("guess").status == 401
    locked = browser.login("guess")
    assert locked.status == 429 and locked.header("retry-after") == "30"
    # The time to come back in the console's one style: relative, its ISO 8601 time on hover.
    assert re.search(r'try again <time datetime="[0-9T:-]+Z" title="[0-9T:-]+Z">in 30 s</time>', locked.text)
    assert COOKIE not in browser.jar
    assert browser.login(TOKEN).status == 429  # the right token too: a locked-out client learns nothing
    assert AsgiConsole(app, client=("198.51.100.8", 1)).login(TOKEN).status == 303  # another client is not locked
    clock.now += 29
    assert browser.login(TOKEN).header("retry-after") == "1"
    clock.now += 2
    again = browser.login("guess")  # past the lockout, the next wrong token locks it out for twice as long
    assert again.status == 429 and again.header("retry-after") == "60"
    clock.now += 61
    assert browser.login(TOKEN).status == 303 and COOKIE in browser.jar
    assert browser.get("/ui/").status == 200
    for _ in range(5):  # the right token reset the count
        assert browser.login("guess").status == 401
    metrics = server.metrics.render()[0].decode()
    assert 'edgesdk_ota_console_logins_refused_total{reason="wrong_token"} 12.0' in metrics
    assert 'edgesdk_ota_console_logins_refused_total{reason="locked_out"} 2.0' in metrics


def test_wrong_tokens_on_the_admin_api_and_the_console_share_one_count_and_one_lockout(console):
    """Issue 60: the console's lockout was bypassed through the admin API, which took the same token with no
    limit. Three wrong tokens at the login and three in the API's Authorization header lock the client out of both."""
    _, app, _, clock = console()
    browser = AsgiConsole(app)
    api = [("authorization", "Bearer guess")]
    assert [browser.login("guess").status for _ in range(3)] == [401] * 3
    assert [browser.request("GET", "/api/devices", headers=api).status for _ in range(2)] == [401] * 2
    locked = browser.request("GET", "/api/devices", headers=api)
    assert locked.status == 429 and locked.header("retry-after") == "30"
    assert json.loads(locked.text)["error"] == "too many wrong tokens from your address: try again in 30 s"
    right = [("authorization", f"Bearer {TOKEN}")]
    assert browser.request("GET", "/api/devices", headers=right).status == 429  # the right token too
    assert browser.login(TOKEN).status == 429  # and the console's login
    other = AsgiConsole(app, client=("198.51.100.8", 1))
    assert other.request("GET", "/api/devices", headers=right).status == 200
    clock.now += 31
    assert browser.request("GET", "/api/devices", headers=right).status == 200  # a right token resets the count
    assert [browser.request("GET", "/api/devices", headers=api).status for _ in range(5)] == [401] * 5


def test_behind_a_trusted_proxy_the_lockout_counts_the_forwarded_client_and_others_cannot_forge_it(console):
    _, app, _, _ = console(proxies="10.0.0.1")
    proxy = AsgiConsole(app, client=("10.0.0.1", 1))
    for _ in range(6):
        # The client prepended a forged hop; the proxy appended the real one, which is what counts.
        last = proxy.login("guess", headers=[("x-forwarded-for", "192.0.2.1, 203.0.113.9")])
    assert last.status == 429
    assert proxy.login("guess", headers=[("x-forwarded-for", "203.0.113.10")]).status == 401
    outsider = AsgiConsole(app, client=("198.51.100.7", 1))  # not a proxy: its X-Forwarded-For is ignored
    answers = [outsider.login("guess", headers=[("x-forwarded-for", f"192.0.2.{i}")]).status for i in range(6)]
    assert answers == [401] * 5 + [429]


def test_the_limiter_and_the_proxy_list_refuse_nonsense_settings():
    with pytest.raises(EdgeSDKError, match="not an IP address or network"):
        Proxies("10.0.0.0/8, proxy.example")
    with pytest.raises(EdgeSDKError, match="free >= 1"):
        LoginLimiter(free=0)
    limiter = LoginLimiter(free=1, base_s=10, max_s=40, max_clients=3, clock=Clock())
    assert [limiter.failed("a") for _ in range(5)] == [0.0, 10.0, 20.0, 40.0, 40.0]  # doubling, capped
    for client in "bcde":
        limiter.failed(client)
    assert len(limiter._records) == 3  # remembered clients are bounded


def test_a_form_body_over_the_cap_gets_413_and_is_not_read(console):
    _, app, rollout, _ = console()
    browser = AsgiConsole(app)
    form = browser.get("/ui/login")
    declared = browser.post("/ui/login", b"token=" + b"a" * (1 << 20))
    assert declared.status == 413 and declared.read == 0  # the declared length alone refuses it
    absurd = browser.request("POST", "/ui/login", body=b"token=x", headers=[("content-length", "9" * 5000)])
    assert absurd.status == 413 and absurd.read == 0
    endless = itertools.repeat(b"a" * 65536)  # no length, and a body that never ends
    streamed = browser.post("/ui/login", endless)
    assert streamed.status == 413 and streamed.read <= FORM_MAX_BYTES + 65536
    assert browser.post("/ui/login", {"login": browser.field(form, "login"), "token": TOKEN}).status == 303
    csrf = browser.field(browser.get(f"/ui/rollouts/{rollout}"), "csrf")
    for action in (f"/ui/rollouts/{rollout}/abort", "/ui/logout"):
        big = browser.post(action, itertools.chain([f"csrf={csrf}&confirm=yes&x=".encode()], endless))
        assert big.status == 413 and big.read <= FORM_MAX_BYTES + 65536
    assert browser.get(f"/ui/rollouts/{rollout}").status == 200  # still logged in, the rollout untouched
    assert "Abort" in browser.get(f"/ui/rollouts/{rollout}").text


def test_over_real_http_a_huge_login_is_answered_413_before_the_client_sends_it(console):
    _, app, _, _ = console()
    port = free_port()
    http = HttpServer(app, "127.0.0.1", port).start()
    try:
        for framing in (b"Content-Length: 1073741824", b"Transfer-Encoding: chunked"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded"
                             b"\r\n" + framing + b"\r\n\r\n")
                chunk = b"a" * 8192
                sock.sendall(chunk if framing.startswith(b"Content") else b"2000\r\n" + chunk + b"\r\n")
                # A server that buffered the body would wait for the other gigabyte (or forever): recv would time out.
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    finally:
        http.stop()


MALFORMED = {
    "a-list": "[1, 2, 3]", "a-string": '"online"', "a-number": "42", "null": "null", "not-json": "{runtime: nope",
    "runtime-text": json.dumps({"runtime": "fast"}),
    "wrong-types": json.dumps({"runtime": {"count": "many", "errors": -3, "p50_ms": [1], "p99_ms": {"v": 1},
                                           "refused": True, "fallbacks": 1.5, "breaker": 7, "paths": "local"},
                               "disk": {"free_bytes": "lots", "store_bytes": -1}, "previous": {"v": "1"},
                               "energy": {"energy_per_inference_mj": "x", "avg_watts": []}}),
    "non-finite": json.dumps({"runtime": {"count": float("nan"), "p99_ms": float("inf"), "p50_ms": float("-inf"),
                                          "paths": {"local": {"count": float("nan")}, "cloud": {"count": 1e308}}},
                              "energy": {"energy_per_inference_mj": float("nan")}}),
    "nested": json.dumps({"runtime": {"paths": {"local": {"count": {"count": {"count": 1}}}, "x" * 5000: [[[]]]}},
                          "disk": [{"free_bytes": 1}], "energy": "lots"}),
    "huge": json.dumps({"runtime": {"breaker": "open" * 15000, "count": 2**70}, "previous": "v" * 60000}),
    "missing": json.dumps({"runtime": {}, "disk": {}, "energy": {}}),
    "good": json.dumps(GOOD),
}


def test_every_page_renders_whatever_a_device_put_in_its_details_and_escapes_its_id(console):
    devices = {f"<img src=x onerror=alert('{name}')>": details for name, details in MALFORMED.items()}
    _, app, rollout, _ = console(devices=devices)
    browser = AsgiConsole(app)
    assert browser.login().status == 303
    pages = ["/ui/", "/ui/groups", "/ui/rollouts", f"/ui/rollouts/{rollout}", "/ui/repository",
             *(f"/ui/devices/{quote(device, safe='')}" for device in devices)]
    for path in pages:
        page = browser.get(path)
        assert page.status == 200, (path, page.text[-500:])
        assert "<img src=x" not in page.text, path  # ids are text, never markup
    home = browser.get("/ui/?group=cams").text
    assert "&lt;img src=x onerror=alert(" in home and home.count("&lt;img src=x") >= len(devices)
    for name in MALFORMED:
        page = browser.get(f"/ui/devices/{quote(next(d for d in devices if name in d), safe='')}").text
        note = re.search(r'id="malformed"[^>]*>(.*?)</p>', page, re.S)
        assert (note is None) == (name in ("good", "missing", "null")), name
    good = browser.get(f"/ui/devices/{quote(next(d for d in devices if 'good' in d), safe='')}").text
    assert "48.25" in good and "breaker closed" in good and "3.0 MB free" in good
    wrong = browser.get(f"/ui/devices/{quote(next(d for d in devices if 'wrong-types' in d), safe='')}").text
    assert "runtime.count" in wrong and "disk.free_bytes" in wrong and "energy.avg_watts" in wrong
    huge = browser.get(f"/ui/devices/{quote(next(d for d in devices if 'huge' in d), safe='')}").text
    assert len(huge) < 20000 and "runtime.count" in huge
    # The not-JSON row makes the per-version table unreadable; the rest of the rollout page still shows.
    assert "Unreadable" in browser.get(f"/ui/rollouts/{rollout}").text


def test_a_rollout_page_compares_versions_from_the_devices_whose_figures_are_sound(console):
    devices = {name: details for name, details in MALFORMED.items() if name != "not-json"}
    _, app, rollout, _ = console(devices=devices)
    browser = AsgiConsole(app)
    browser.login()
    table = browser.get(f"/ui/rollouts/{rollout}").text.split('id="versions-heading"')[1]
    cells = re.findall(r"<td>([^<]*)</td>", table)
    # 0.9.0 on every device; only "good" reports a sound p99 (48.25) and paths (local 90, cloud 10 + 1e308 dropped).
    assert cells[:5] == ["0.9.0", str(len(devices)), "1", "48.25", "10%"]


def test_parse_details_types_every_field_and_names_what_it_dropped():
    parsed = parse_details(json.loads(MALFORMED["wrong-types"]))
    assert parsed.runtime.count is None and parsed.runtime.fallbacks is None and parsed.paths == {}
    assert set(parsed.malformed) >= {"runtime.count", "runtime.errors", "runtime.paths", "previous", "disk.free_bytes"}
    good = parse_details(GOOD)
    assert good.malformed == () and good.runtime.p99_ms == 48.25 and good.paths["local"].count == 90
    assert good.disk.free_bytes == 3 * 1048576 and good.previous == "0.8.0"
    assert parse_details([1]).malformed == ("details",) and parse_details(None).malformed == ()


def test_edgesdk_server_takes_behind_proxy_addresses_only(tmp_path):
    from click.testing import CliRunner

    from edgesdk.cli.server import server

    base = ["--broker", "mqtt://127.0.0.1:1", "--repo", str(tmp_path / "repo"), "--db", str(tmp_path / "fleet.db"),
            "--key", __file__]
    wrong = CliRunner().invoke(server, [*base, "--ui", "--behind-proxy", "127.0.0.1,nginx"])
    assert wrong.exit_code == 2 and "'nginx' is not an IP address or network" in wrong.output


def _post_login(url: str, token: str, forwarded_for: str) -> tuple[int, str | None]:
    """A login over real HTTP from loopback with ``X-Forwarded-For``: (status, its session Set-Cookie line)."""
    import http.client
    from urllib.parse import urlencode, urlparse

    where = urlparse(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        headers = {"X-Forwarded-For": forwarded_for, "X-Forwarded-Proto": "https"}
        connection.request("GET", "/ui/login", headers=headers)
        form = connection.getresponse()
        page = form.read().decode()
        login = re.search(r'name="login" value="([^"]*)"', page).group(1)
        cookie = form.getheader("set-cookie").split(";", 1)[0]
        connection.request("POST", "/ui/login", body=urlencode({"login": login, "token": token}),
                           headers={**headers, "Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"})
        answer = connection.getresponse()
        answer.read()
        session = next((v for k, v in answer.getheaders() if k.lower() == "set-cookie" and v.startswith(COOKIE)), None)
        return answer.status, session
    finally:
        connection.close()


def test_edgesdk_server_behind_proxy_reaches_the_console_of_a_real_server(broker, start_server):
    # The proxy chain: a loopback proxy in front, an upstream one at 203.0.113.9. Only with --behind-proxy naming the
    # upstream one does the console look past it to the client; each client is counted on its own.
    running = start_server(broker.url, token=TOKEN, console=True, behind_proxy="127.0.0.1,203.0.113.0/24")
    statuses = [_post_login(running.url, "guess", "198.51.100.1, 203.0.113.9")[0] for _ in range(6)]
    assert statuses == [401] * 5 + [429]
    status, session = _post_login(running.url, TOKEN, "198.51.100.2, 203.0.113.9")
    assert status == 303 and session is not None and "secure" in session.lower()
