"""``edgesdk emulator setup|status|count``: the emulated board cores the converter counts variants on."""

from __future__ import annotations

import json

import click


@click.group()
def emulator() -> None:
    """Board cost without the board: qemu-user runs a model with the board's own aarch64 kernels."""


@emulator.command("setup")
@click.option("--force", is_flag=True, help="Rebuild the userland even if one exists for these versions.")
def setup(force: bool) -> None:
    """Build the aarch64 userland for this host's onnxruntime/LiteRT versions (about 10 s; cached)."""
    from edgesdk.converters.board.emulate import Emulator
    from edgesdk.converters.board.userland import build_userland

    userland = build_userland(force=force, log=lambda line: click.echo(line, err=True))
    Emulator()  # builds the counting plugin now rather than during the first conversion
    click.echo(f"ready: {userland.runtime} in {userland.path}")


@emulator.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def status(as_json: bool) -> None:
    """Say whether board estimates are emulated here, and if not, how to enable them."""
    from edgesdk.converters.board.emulate import Emulator
    from edgesdk.errors import EmulatorError

    try:
        found = Emulator()
        state = {"ready": True, "runtime": found.userland.runtime if found.userland else None,
                 "plugin": str(found.plugin)}
    except EmulatorError as exc:
        state = {"ready": False, "reason": str(exc)}
    if as_json:
        click.echo(json.dumps(state))
    else:
        click.echo(f"ready: {state['runtime']}" if state["ready"] else f"not ready: {state['reason']}")


@emulator.command("count")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--cpu", default="cortex-a76", show_default=True,
              help="qemu CPU model: cortex-a53, cortex-a57, cortex-a72, cortex-a76, neoverse-n1, haswell.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def count(model: str, cpu: str, as_json: bool) -> None:
    """Instructions one inference of MODEL (random input of its shape) retires on an emulated CPU."""
    from dataclasses import asdict

    from edgesdk.converters.board.emulate import Emulator
    from edgesdk.runtime.bench import random_inputs
    from edgesdk.runtime.runtime import Runtime

    with Runtime(model, threads=1) as runtime:
        inputs = random_inputs(runtime.inputs)
    result = Emulator(require_userland=cpu != "haswell").count(model, inputs, cpu)
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    click.echo(f"{result.instructions / 1e6:.2f} M instructions per inference on {result.label} "
               f"({result.simd / result.instructions:.0%} vector/FP, {result.memory / result.instructions:.0%} "
               f"loads/stores; windows agree to {result.spread:.2%}){' (cached)' if result.cached else ''}")
