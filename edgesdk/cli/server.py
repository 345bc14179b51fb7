"""``edgesdk server`` (the OTA server), ``edgesdk server inference`` (KServe V2 only) and ``mosquitto-config``."""

from __future__ import annotations

import os
import secrets
import signal
import threading
from pathlib import Path
from typing import Any

import click


def _require_server_extra(embedded_broker: bool, inference: bool = False, grpc: bool = False,
                          console: bool = False) -> None:
    """Fail with the install hint, before any work, when the ``[server]`` extra is missing."""
    import importlib

    from edgesdk.errors import EdgeSDKError

    modules = ["starlette", "uvicorn", *(["jinja2"] if console else []), *(["amqtt"] if embedded_broker else []),
               *(["prometheus_client"] if inference else []), *(["grpc"] if grpc else [])]
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise EdgeSDKError(f"edgesdk server needs the [server] extra ({', '.join(missing)} not installed): "
                           "pip install 'edgesdk[server]'")


def _token(token: str | None, token_file: Path) -> str:
    if token:
        return token
    if token_file.exists():
        return token_file.read_text().strip()
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    click.echo(f"admin token written to {token_file}", err=True)
    return token


@click.group(invoke_without_command=True)
@click.option("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT")
@click.option("--repo", type=click.Path(file_okay=False), help="Model repository directory.")
@click.option("--db", envvar="EDGESDK_DB",
              help="Fleet state: a SQLite file, or postgresql://USER:PASSWORD@HOST:PORT/DATABASE (env EDGESDK_DB).")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="Server Ed25519 private key (signs commands).")
@click.option("--bundle-key", type=click.Path(exists=True, dir_okay=False),
              help="Public key uploaded bundles must be signed with.")
@click.option("--allow-unsigned", is_flag=True, help="DEVELOPMENT ONLY: accept unsigned bundles.")
@click.option("--http", "http_address", default="127.0.0.1:8080", show_default=True, help="Admin API HOST:PORT.")
@click.option("--token", envvar="EDGESDK_TOKEN", help="Admin API token (default: read or create --token-file).")
@click.option("--ui", "console", is_flag=True,
              help="Serve the operator console at /ui on the --http address (log in with the admin token).")
@click.option("--behind-proxy", metavar="ADDRESSES",
              help="The reverse proxies in front of the --http address (IPs or networks, comma-separated; * for "
                   "any peer). Their X-Forwarded-For names the client that wrong-token lockouts count (the admin "
                   "API's and the console's: one count) and their X-Forwarded-Proto: https makes the console's "
                   "cookies Secure; from anyone else both are ignored.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Default: admin.token beside a SQLite --db (with PostgreSQL, give --token or --token-file).")
@click.option("--replica", is_flag=True,
              help="One of several servers on one PostgreSQL --db, --repo and broker: device reports are split "
                   "between them (MQTT shared subscriptions) and each rollout is driven by one of them at a time.")
@click.option("--name", "server_name", default=None,
              help="This server's name among replicas: its MQTT client id and the driver shown by `rollout status` "
                   "(default: edgesdk-server-<random>).")
@click.option("--lease", default="10s", show_default=True,
              help="With --replica: a replica that stops renewing its rollouts for this long loses them to another.")
@click.option("--credentials", type=click.Path(exists=True, dir_okay=False),
              help="Broker credentials JSON (credentials/server.json from mosquitto-config).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA certificate for mqtts://.")
@click.option("--keep-latest", default=5, show_default=True, help="Versions kept per model (plus pinned/in use).")
@click.option("--embedded-broker", is_flag=True,
              help="Run an in-process MQTT broker (amqtt, no passwords) on 127.0.0.1, on the port of --broker "
                   "(mqtt://127.0.0.1:PORT) or a free one (no mosquitto needed).")
@click.option("--inference", "inference_address", metavar="HOST:PORT",
              help="Also serve the repository's models over KServe V2 (cloud offload) on HOST:PORT; no auth.")
@click.option("--inference-grpc", "inference_grpc", metavar="HOST:PORT",
              help="Also serve the KServe V2 gRPC service (inference.GRPCInferenceService) on HOST:PORT, on the same "
                   "models, batchers and metrics as the HTTP endpoint.")
@click.option("--inference-config", type=click.Path(exists=True, dir_okay=False),
              help="YAML {models: [{name, version?, preferred_batch_size?, max_queue_delay_us?, adaptive_queue_delay?, "
                   "max_queue?, batching?}]} (default: every model, newest version, batching on).")
@click.option("--inference-threads", type=click.IntRange(min=1), metavar="N", help="ONNX Runtime threads per model session.")
@click.option("--offload-url", metavar="URL",
              help="The KServe V2 endpoint as devices reach it, named (with the model and version) in every deploy "
                   "command so apps following the agent's store offload there. Default: http://HOST:PORT of "
                   "--inference; pass the public URL when devices are on other machines.")
@click.option("--compress-min-saving", default=0.10, show_default=True, type=click.FloatRange(0.0, 1.0, max_open=True),
              help="Send an archive chunk zstd-compressed when that saves more than this share of its bytes "
                   "(0 compresses whatever shrinks).")
@click.option("--no-compress", is_flag=True, help="Send every chunk as it is (devices then need no zstd).")
@click.option("--root", "root_file", type=click.Path(exists=True, dir_okay=False),
              help="The fleet's root of trust (root.json of `edgesdk keys`), published to devices, retained.")
@click.option("--timestamp-key", type=click.Path(exists=True, dir_okay=False),
              help="The timestamp role's private key: publish signed freshness metadata (devices report `stale` "
                   "when it stops).")
@click.option("--timestamp-every", default="60s", show_default=True, help="How often a timestamp is published.")
@click.option("--timestamp-expires", default="5m", show_default=True, help="How long each timestamp is valid.")
@click.option("--devices", "devices_file", type=click.Path(exists=True, dir_okay=False),
              help="Provision these devices at start: one 'DEVICE_ID GROUP' per line (the file mosquitto-config "
                   "reads). A device's reports must name the group it is provisioned in.")
@click.option("--require-provisioning/--trust-first-report", default=None,
              help="Refuse the reports of devices nobody provisioned (--devices, `edgesdk devices provision`), or "
                   "let a device's first report put it in the group it names. Default: refuse with --devices (the "
                   "file names every device there is), trust the first report without it.")
@click.option("--max-catch-up", default=500, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Devices catching up at once (back from offline, or new to their group) across the fleet; the "
                   "rest wait their turn in the store.")
@click.option("--reconcile-every", default="5s", show_default=True,
              help="How often devices that came back or joined their group are sent its release: those of one pass "
                   "go out together and share the server's work. A returning device waits up to this long (at most "
                   "half of --lease).")
@click.pass_context
def server(ctx: click.Context, broker: str | None, repo: str | None, db: str | None, key: str | None,
           bundle_key: str | None, allow_unsigned: bool, http_address: str, token: str | None, console: bool,
           behind_proxy: str | None, token_file: str | None,
           replica: bool, server_name: str | None, lease: str, credentials: str | None, ca_file: str | None,
           keep_latest: int, embedded_broker: bool,
           inference_address: str | None, inference_grpc: str | None, inference_config: str | None,
           inference_threads: int | None, offload_url: str | None, compress_min_saving: float, no_compress: bool,
           root_file: str | None, timestamp_key: str | None, timestamp_every: str, timestamp_expires: str,
           devices_file: str | None, require_provisioning: bool | None, max_catch_up: int, reconcile_every: str) -> None:
    """Run the OTA server: model repository, fleet state, rollouts over MQTT, admin HTTP API (and, with
    --inference, the KServe V2 endpoint devices offload to)."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [name for name, value in (("--broker", broker or embedded_broker), ("--repo", repo), ("--db", db),
                                        ("--key", key)) if not value]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)}")
    assert repo and db and key
    is_url = "://" in db
    if is_url and not (token or token_file):
        raise click.UsageError("with a database URL as --db, give the admin token with --token or --token-file "
                               "(every replica needs the same one)")
    if replica and not db.startswith(("postgresql://", "postgres://")):
        raise click.UsageError("--replica needs a PostgreSQL --db (postgresql://USER:PASSWORD@HOST:PORT/DATABASE) "
                               "that every replica shares")
    from edgesdk.cli.fleet import positive_seconds
    from edgesdk.fleet.records import parse_duration

    lease_s = positive_seconds(lease, "--lease", "10s")
    reconcile_s = positive_seconds(reconcile_every, "--reconcile-every", "5s")
    if behind_proxy is not None:
        _check_proxies(behind_proxy)
    if inference_grpc and not inference_address:
        raise click.UsageError("--inference-grpc serves beside the HTTP endpoint: give --inference HOST:PORT too")
    if offload_url is None and inference_address:
        offload_url = f"http://{inference_address}"
    if offload_url is not None and not offload_url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{offload_url!r} is not an http:// or https:// URL", param_hint="--offload-url")
    _require_server_extra(embedded_broker, inference_address is not None, inference_grpc is not None, console)
    from edgesdk.cli.devices import read_devices_file

    devices = read_devices_file(devices_file) if devices_file else None
    from edgesdk.logs import configure

    configure(info_loggers=("edgesdk.ota_server",))  # rollout transitions are the operator's record
    embedded = None
    if embedded_broker:
        from edgesdk.ota_server.broker import embedded_broker_for

        embedded = embedded_broker_for(broker)
        broker = embedded.url
        click.echo(f"embedded MQTT broker on {broker} (loopback only)", err=True)
    assert broker
    from edgesdk.fleet.transport import load_credentials
    from edgesdk.ota_server.app import ServerSetup, build_server
    from edgesdk.ota_server.server import ServerConfig
    from edgesdk.runtime.signing import load_private_key, load_public_key

    username, password = load_credentials(credentials) if credentials else (None, None)
    running = build_server(ServerSetup(
        ServerConfig(broker, username=username, password=password, ca_file=ca_file,
                     offload_url=offload_url, share_group="edgesdk" if replica else None, lease_s=lease_s,
                     name=server_name, compress_min_saving=None if no_compress else compress_min_saving,
                     timestamp_every_s=parse_duration(timestamp_every), timestamp_expires_s=parse_duration(timestamp_expires),
                     max_catch_up=max_catch_up, require_provisioning=require_provisioning, reconcile_s=reconcile_s),
        repo=repo, db=db, signing_key=load_private_key(key),
        bundle_key=load_public_key(bundle_key) if bundle_key else None, allow_unsigned=allow_unsigned,
        keep_latest=keep_latest, http=http_address, console=console, behind_proxy=behind_proxy,
        token=_token(token, Path(token_file) if token_file else Path(db).parent / "admin.token"),
        inference=inference_address, inference_grpc=inference_grpc,
        inference_config=_inference_config(inference_config, inference_threads) if inference_address else None,
        root=Path(root_file).read_bytes() if root_file else None,
        timestamp_key=load_private_key(timestamp_key) if timestamp_key else None, devices=devices))
    click.echo(f"edgesdk server: broker {broker}, admin API {running.url}"
               + (f", console {running.url}/ui/" if console else "")
               + (f", inference {running.inference_url}/v2" if running.inference_url else "")
               + (f", inference gRPC {running.inference.grpc_address}" if inference_grpc else ""), err=True)
    _wait_for_signal()
    running.stop()
    if embedded is not None:
        embedded.stop()


def _check_proxies(behind_proxy: str) -> None:
    """--behind-proxy names addresses."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.ota_server.admin.client_guard import Proxies

    try:
        Proxies(behind_proxy)
    except EdgeSDKError as exc:
        raise click.BadParameter(str(exc), param_hint="--behind-proxy") from None


def _inference_config(path: str | None, threads: int | None) -> Any:
    from edgesdk.ota_server.inference import InferenceConfig
    from edgesdk.ota_server.inference.config import inference_config_from_file

    return inference_config_from_file(path, threads) if path else InferenceConfig(threads=threads)


def _wait_for_signal() -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()


@server.command("inference")
@click.option("--repo", type=click.Path(exists=True, file_okay=False), required=True,
              help="Model repository directory (the OTA server's --repo).")
@click.option("--listen", default="127.0.0.1:8081", show_default=True, metavar="HOST:PORT", help="Address to serve on.")
@click.option("--inference-config", type=click.Path(exists=True, dir_okay=False),
              help="YAML {models: [{name, version?, preferred_batch_size?, max_queue_delay_us?, adaptive_queue_delay?, "
                   "max_queue?, batching?}]} (default: every model, newest version, batching on).")
@click.option("--grpc", "--inference-grpc", "grpc_listen", metavar="HOST:PORT",
              help="Also serve the KServe V2 gRPC service (inference.GRPCInferenceService) on HOST:PORT.")
@click.option("--threads", type=click.IntRange(min=1), metavar="N", help="ONNX Runtime threads per model session.")
def inference(repo: str, listen: str, inference_config: str | None, grpc_listen: str | None, threads: int | None) -> None:
    """Serve a repository's models over KServe V2 only (a box that takes offloaded work; no MQTT, no admin API)."""
    _require_server_extra(False, inference=True, grpc=grpc_listen is not None)
    from edgesdk.ota_server.inference import serve_inference

    config = _inference_config(inference_config, threads)
    running = serve_inference(repo, listen, config=config, grpc_listen=grpc_listen)
    click.echo(f"edgesdk inference endpoint: {running.url}/v2 (metrics {running.url}/metrics)"
               + (f", gRPC {running.grpc_address}" if running.grpc_address else ""), err=True)
    _wait_for_signal()
    running.stop()


@server.command("mosquitto-acl")
@click.option("--devices", "devices_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Text file: one 'DEVICE_ID GROUP' per line (the groups as they are now).")
@click.option("--out", "out_dir", type=click.Path(exists=True, file_okay=False), required=True,
              help="The directory mosquitto-config wrote.")
def mosquitto_acl(devices_file: str, out_dir: str) -> None:
    """Rewrite only the broker's ACL after devices moved groups (the passwords stay); then reload the broker."""
    from edgesdk.cli.devices import read_devices_file
    from edgesdk.ota_server.mosquitto import write_acl

    path = write_acl(out_dir, read_devices_file(devices_file))
    click.echo(f"wrote {path}; reload the broker so moved devices read their new group's chunks only: "
               "kill -HUP $(pidof mosquitto), or mosquitto_signal -a config-reload")


@server.command("mosquitto-config")
@click.option("--devices", "devices_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Text file: one 'DEVICE_ID GROUP' per line.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
@click.option("--port", default=1883, show_default=True)
@click.option("--bind", default="127.0.0.1", show_default=True)
@click.option("--certfile", type=click.Path(exists=True, dir_okay=False), help="Enable TLS with this certificate.")
@click.option("--keyfile", type=click.Path(exists=True, dir_okay=False))
def mosquitto_config(devices_file: str, out_dir: str, port: int, bind: str, certfile: str | None,
                     keyfile: str | None) -> None:
    """Write a password file, an ACL and a mosquitto.conf so each device sees only its own topics."""
    from edgesdk.cli.devices import read_devices_file
    from edgesdk.ota_server.mosquitto import write_mosquitto_config

    devices = read_devices_file(devices_file)
    config = write_mosquitto_config(out_dir, devices, port=port, bind=bind, certfile=certfile, keyfile=keyfile)
    click.echo(f"wrote {config.conf}, {config.password_file}, {config.acl_file} and {len(devices)} device credentials "
               f"in {config.conf.parent / 'credentials'}")
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"start the broker with: {config.command}")
