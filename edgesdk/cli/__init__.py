"""The ``edgesdk`` command line. Thin: it parses, calls the library, prints.

Subcommands live in their own modules and are imported only when run, so
``edgesdk --help`` does not pay for numpy or onnxruntime.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError

#: command name -> (module, attribute, one-line help shown by --help without importing it)
_COMMANDS = {
    "profile": ("edgesdk.cli.profile", "profile", "List, show and detect device profiles."),
    "bench": ("edgesdk.cli.bench", "bench", "Measure a model's latency, throughput and memory here."),
    "convert": ("edgesdk.cli.convert", "convert", "Quantize/convert a model to fit a device; write a bundle."),
    "keys": ("edgesdk.cli.keys", "keys", "Signing keys and the fleet's root of trust."),
    "sign": ("edgesdk.cli.keys", "sign", "Sign a bundle's manifest."),
    "verify": ("edgesdk.cli.keys", "verify", "Verify a bundle's hashes and signature."),
    "agent": ("edgesdk.cli.agent", "agent", "Run the device agent (OTA updates over MQTT)."),
    "server": ("edgesdk.cli.server", "server", "Run the OTA server; write a mosquitto ACL config."),
    "push": ("edgesdk.cli.push", "push", "Upload a bundle and start a canary rollout to a group."),
    "rollout": ("edgesdk.cli.fleet", "rollout", "Show, promote, abort or roll back rollouts."),
    "devices": ("edgesdk.cli.devices", "devices", "List devices and their versions; put devices in groups."),
    "groups": ("edgesdk.cli.devices", "groups", "Show each group's release and how many devices run it."),
    "emulator": ("edgesdk.cli.emulator", "emulator", "Set up and use the emulated board cores variants are costed on."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module, attribute, _ = _COMMANDS[name]
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, short) for name, (_, _, short) in sorted(_COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # The one place library errors become a message and an exit code, without a traceback.
        try:
            return super().invoke(ctx)
        except EdgeSDKError as exc:
            if os.environ.get("EDGESDK_LOG_FORMAT") == "json":  # set by configure(): a log collector reads stderr
                import logging

                logging.getLogger("edgesdk.cli").error("error: %s", exc, extra={"exit_code": exc.exit_code})
            else:
                click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="edgesdk")
@click.option("-v", "--verbose", is_flag=True, envvar="EDGESDK_VERBOSE",
              help="Show INFO logs and third-party libraries' output (env EDGESDK_VERBOSE=1).")
@click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              envvar="EDGESDK_LOG_FORMAT", show_default=True,
              help="Logs as text, or as one JSON object per line for log collectors (env EDGESDK_LOG_FORMAT=json).")
def cli(verbose: bool, log_format: str) -> None:
    """edgesdk: convert, run and update models on edge devices."""
    from edgesdk.logs import configure

    configure(verbose, log_format=log_format.lower())


def main() -> None:
    """Entry point of the ``edgesdk`` console script; exits with the command's status (an EdgeSDKError's exit_code)."""
    cli()
