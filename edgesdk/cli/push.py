"""``edgesdk push``: upload a release and start a canary rollout of it, with its options' policy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from edgesdk.cli.fleet import (
    _WAIT_DEFERRED,
    _WAIT_OUTCOME,
    _finish,
    admin_client,
    json_option,
    positive_seconds,
    server_option,
    token_file_option,
    token_option,
)
from edgesdk.fleet.records import RolloutPolicy, parse_duration, parse_percent


def _option(parse: Callable[[str], float], text: str, option: str) -> float:
    """``parse(text)``, a malformed value being a usage error (exit 2) that names ``option``."""
    from edgesdk.errors import EdgeSDKError

    try:
        return parse(text)
    except EdgeSDKError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _ratio(text: str) -> float:
    """``1.5`` or ``1.5x`` as 1.5 (an EdgeSDKError naming the value when malformed)."""
    from edgesdk.errors import EdgeSDKError

    try:
        return float(text.strip().lower().removesuffix("x"))
    except ValueError:
        raise EdgeSDKError(f"{text!r} is not a ratio; write e.g. 1.5 (or 1.5x), or off") from None


def _limit(parse: Callable[[str], float], text: str, option: str) -> float | None:
    """A canary analysis limit: ``off`` (None: not judged) or ``parse(text)`` (:func:`_option`)."""
    return None if text.strip().lower() == "off" else _option(parse, text, option)


#: The policy fields push reads from an option's text: field -> (click parameter, how it is read).
_READ: dict[str, tuple[str, Callable[[str], float]]] = {
    "health_window_s": ("health_window", parse_duration),
    "max_failure_rate": ("max_failure_rate", parse_percent),
    "deploy_timeout_s": ("deploy_timeout", parse_duration),
    "max_late_failure_rate": ("max_late_failure_rate", parse_percent),
    "min_evidence": ("min_evidence", parse_percent),
    "evidence_grace_s": ("evidence_grace", parse_duration),
    "max_baseline_age_s": ("max_baseline_age", parse_duration),
}
#: The canary analysis limits ('off': not judged): field (= click parameter) -> how it is read.
_LIMITS: dict[str, Callable[[str], float]] = {
    "max_p99_ratio": _ratio, "max_error_rate": parse_percent, "max_offload_share": parse_percent}


def _flag(parameter: str) -> str:
    return "--" + parameter.replace("_", "-")


def _policy(options: dict[str, Any]) -> RolloutPolicy:
    """push's options (click's keyword arguments) as a policy; a value out of range, or stages that
    do not increase to 100%, exit 2 (usage) with the message that says how to write them, as click's
    own option errors do."""
    from edgesdk.errors import EdgeSDKError

    first = _option(parse_percent, options["canary"], "--canary")
    waves = options["waves"]
    stages = (tuple(_option(parse_percent, w, "--waves") for w in waves.split(",")) if waves
              else tuple(w for w in (0.5, 1.0) if w > first))
    read = {field: _option(parse, options[name], _flag(name))
            for field, (name, parse) in _READ.items()}
    limits: dict[str, Any] = {name: _limit(parse, options[name], _flag(name))
                              for name, parse in _LIMITS.items()}
    try:
        return RolloutPolicy(canary=first, waves=stages, auto_promote=not options["manual"],
                             analysis=not options["no_analysis"], min_calls=options["min_calls"],
                             on_inconclusive=options["on_inconclusive"], **read, **limits)
    except EdgeSDKError as exc:
        raise click.UsageError(str(exc)) from None


def _say_release(group: str, answer: dict[str, Any]) -> None:
    """Say on stderr what the push changes: inputs or outputs (allowed with
    --allow-signature-change), a replaced model, and devices whose board the release has no bundle
    for."""
    check = answer.get("check") or {}
    for change in check.get("signature_changes") or ():
        click.echo(f"signature change (allowed): {change}", err=True)
    if answer.get("no_artifact"):
        has = ", ".join(answer.get("artifacts") or ()) or "none"
        click.echo(f"warning: {answer['no_artifact']} devices of group {group} run on a board "
                   f"this release has no bundle for (it has {has}): they stay on their version; "
                   f"`edgesdk devices --group {group}` shows each device's board", err=True)


def _warn_collapsed(group: str, plan: list[dict[str, Any]]) -> None:
    """Say on stderr which waves of the plan add no device of their own (the group is too small for
    them)."""
    merged = [s for s in plan if s.get("collapsed")]
    if not merged:
        return
    shown = ", ".join(f"{s['percent']:g}% ({s['devices']} devices, 0 new)" for s in merged)
    if len(merged) > 1:
        waves, verb = "waves", "add no device and are"
    else:
        waves, verb = "wave", "adds no device and is"
    click.echo(f"warning: group {group} has {plan[-1]['devices']} devices, too few for every "
               f"stage: {waves} {shown} {verb} merged into the stage before; "
               f"{len(plan) - len(merged)} stages go out (fewer --waves, or a larger group, avoids "
               "this)", err=True)


@click.command()
@click.argument("bundles", metavar="BUNDLE...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--group", required=True)
@click.option("--replace", metavar="MODEL", default=None,
              help="Let this release replace MODEL, the other model the group runs now (else "
                   "refused).")
@click.option("--allow-signature-change", is_flag=True,
              help="Let the release's inputs or outputs differ from the version the group runs "
                   "(else refused).")
@click.option("--canary", default="10%", show_default=True,
              help="First stage, as a share of the group.")
@click.option("--waves", default=None,
              help="The later stages after the canary: increasing cumulative percentages ending "
                   "at 100 [default: 50,100, or those of them above --canary].")
@click.option("--health-window", default="60s", show_default=True,
              help="Wait after each stage before the next.")
@click.option("--max-failure-rate", default="5%", show_default=True,
              help="Abort and roll back above this.")
@click.option("--deploy-timeout", default="300s", show_default=True,
              help="A silent device counts as failed after it.")
@click.option("--manual", is_flag=True, help="Wait for `edgesdk rollout promote` between stages.")
@click.option("--max-late-failure-rate", default="20%", show_default=True,
              help="Flag the release when more of the devices it reaches late (back from offline, "
                   "or new to the group) fail to install it.")
@click.option("--max-p99-ratio", default="1.5", show_default=True,
              help="Canary analysis: a device fails when its p99 latency on the release is more "
                   "than this many times its board's baseline, the devices still on the old "
                   "version ('off': not judged).")
@click.option("--max-error-rate", default="1%", show_default=True,
              help="Canary analysis: a device fails when its error rate is more than this above "
                   "its board's baseline, with 95% confidence (absolute without a baseline; 'off': "
                   "not judged).")
@click.option("--max-offload-share", default="25%", show_default=True,
              help="Canary analysis: a device fails when it sends more than this larger a share "
                   "of its predict_async requests to the cloud than its board's baseline ('off': "
                   "not judged).")
@click.option("--min-evidence", default="50%", show_default=True,
              help="A stage passes only when this share of its devices (and of each board's) made "
                   "--min-calls calls on the release; else its verdict is inconclusive.")
@click.option("--min-calls", type=click.IntRange(min=1), default=100, show_default=True,
              help="Calls on the release a device needs before its figures are evidence.")
@click.option("--evidence-grace", default="2m", show_default=True,
              help="How long after the health window a stage may wait for that evidence.")
@click.option("--on-inconclusive", type=click.Choice(["pause", "abort"]), default="pause",
              show_default=True,
              help="What a stage without enough evidence does: pause for `edgesdk rollout "
                   "promote`, or abort.")
@click.option("--max-baseline-age", default="1h", show_default=True,
              help="Baseline figures older than this are not used.")
@click.option("--no-analysis", is_flag=True,
              help="Judge no figures: stages pass on install reports alone (for fleets whose apps "
                   "report none).")
@click.option("--wait", "wait_s", type=float, default=None, help=_WAIT_OUTCOME)
@click.option("--wait-deferred", metavar="DURATION", default=None, help=_WAIT_DEFERRED)
@server_option
@token_option
@token_file_option
@json_option
def push(bundles: tuple[str, ...], group: str, replace: str | None, allow_signature_change: bool,
         wait_s: float | None, wait_deferred: str | None, server_url: str, token: str | None,
         token_file: str | None, as_json: bool, **options: Any) -> None:
    """Upload each BUNDLE (unless the identical bundle is stored) and start a rollout of their
    release to every device of GROUP; devices offline then are deferred and get it when they report
    again.

    Several bundles of one name and version, converted for different boards (--profile), are one
    release: each device gets its board's bundle (else the generic-<arch> one), and a device of a
    board with none is reported and left on its version. A push refuses, before anything is sent,
    another model than the group runs (pass --replace MODEL) and other inputs or outputs than the
    version it runs (pass --allow-signature-change).

    Each stage passes only on evidence: its devices' own figures of the apps' calls on the release,
    judged board by board against the devices still on the old version. Without enough of them by
    the end of the health window and --evidence-grace, the verdict is inconclusive and the rollout
    pauses (or aborts: --on-inconclusive abort). A fleet whose apps report no figures is rolled out
    with --no-analysis, and push says what was not judged."""
    from edgesdk.fleet.archive import pack_bundle
    from edgesdk.runtime.bundle import read_bundle

    deferred_s = None
    if wait_deferred is not None:
        deferred_s = positive_seconds(wait_deferred, "--wait-deferred")
    policy = _policy(options)
    manifests = [read_bundle(bundle).manifest for bundle in bundles]
    releases = sorted({(m.name, m.version) for m in manifests})
    if len(releases) > 1:
        named = ", ".join(" ".join(r) for r in releases)
        raise click.UsageError(f"the bundles are {len(releases)} releases ({named}); push one name "
                               "and version at a time (one bundle per board)")
    manifest = manifests[0]
    client = admin_client(server_url, token, token_file)
    for bundle, m in zip(bundles, manifests):
        stored = client.upload(pack_bundle(bundle))["stored"]
        said = "uploaded" if stored else "already stored:"
        click.echo(f"{said} {m.name} {m.version} for {m.target_profile}", err=True)
    answer = client.start_release(manifest.name, manifest.version, group, policy, replace=replace,
                                  allow_signature_change=allow_signature_change)
    rollout_id, plan = str(answer["id"]), list(answer["plan"])
    _warn_collapsed(group, plan)
    _say_release(group, answer)
    for unjudged in policy.not_judged():
        click.echo(f"not judged: {unjudged}", err=True)
    if wait_s is None and deferred_s is None:
        click.echo(json.dumps(answer) if as_json else f"started rollout {rollout_id}")
        return
    click.echo(f"started rollout {rollout_id}", err=True)
    _finish(client, rollout_id, wait_s, as_json, wait_deferred=deferred_s, plan=plan)
