"""`kvpilot plan -f manifest.yaml [--gpu PROFILE] [-o table|json]`: the operator's plan, no cluster needed.

Imports neither kopf nor kubernetes nor torch. Exit status: 0 when every InferenceService in the file is
planned, 1 when one is not (infeasible, invalid, unknown profile, no model config), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml
from kvpilot.operator.hub_config import ConfigFetcher, HubConfigFetcher
from kvpilot.operator.planning.outcome import PlanOutcome, plan_service
from kvpilot.operator.planning.profiles import ProfileError, ProfileStore, parse_profiles
from kvpilot.operator.planning.sizing import GIB

KIND = "InferenceService"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvpilot plan", description=__doc__.split("\n")[0])
    p.add_argument(
        "-f", "--filename", required=True, help="manifest with InferenceService documents ('-': stdin)"
    )
    p.add_argument("--gpu", help="plan for this GPU profile instead of spec.gpu.profile")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--profiles", help="YAML list of admin GPU profiles (the ConfigMap's profiles.yaml)")
    p.add_argument("--offline", action="store_true", help="never fetch config.json from the Hugging Face Hub")
    return p


def main(argv: list[str]) -> int:
    return run(argv, fetch=None, out=sys.stdout, err=sys.stderr)


def run(argv: list[str], fetch: ConfigFetcher | None, out: TextIO, err: TextIO) -> int:
    """main() with its dependencies passed in; fetch=None uses the Hub unless --offline."""
    args = parser().parse_args(argv)
    try:
        services = load_services(args.filename)
        store = load_profiles(args.profiles)
    except (OSError, yaml.YAMLError, ProfileError, ValueError) as exc:
        print(f"kvpilot plan: {exc}", file=err)
        return 2
    outcomes = asyncio.run(plan_all(services, store, fetch, args.gpu, args.offline))
    if args.output == "json":
        plans = [as_json(outcome) for outcome in outcomes]
        json.dump(plans[0] if len(plans) == 1 else plans, out, indent=2)
        out.write("\n")
    else:
        tables = [as_table(service, outcome) for service, outcome in zip(services, outcomes, strict=True)]
        out.write("\n".join(tables))
    return 0 if all(outcome.planned for outcome in outcomes) else 1


def load_services(filename: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind") == KIND]
    if not docs:
        raise ValueError(f"{filename}: no {KIND} documents")
    return docs


def load_profiles(path: str | None) -> ProfileStore:
    store = ProfileStore()
    if path:
        store.load_admin(parse_profiles(Path(path).read_text(), path))
    return store


async def plan_all(
    services: list[dict[str, Any]],
    store: ProfileStore,
    fetch: ConfigFetcher | None,
    gpu: str | None,
    offline: bool,
) -> list[PlanOutcome]:
    hub = None if offline or fetch is not None else HubConfigFetcher()
    try:
        return [await plan_service(s.get("spec"), store, fetch or hub, gpu) for s in services]
    finally:
        if hub is not None:
            await hub.aclose()


def as_json(outcome: PlanOutcome) -> dict[str, Any]:
    """status.plan of this outcome; a spec that never reached planning says why in `reason`."""
    if outcome.plan is not None:
        return outcome.plan.to_status()
    return {"feasible": False, "reason": f"{outcome.reason}: {outcome.message}"}


def as_table(service: dict[str, Any], outcome: PlanOutcome) -> str:
    meta = service.get("metadata") or {}
    uri = ((service.get("spec") or {}).get("model") or {}).get("uri", "?")
    lines = [f"{meta.get('name', '?')}: {uri}"]
    if outcome.plan is None or not outcome.plan.feasible:
        return "\n".join([*lines, f"  NOT PLANNED ({outcome.reason}): {outcome.message}", ""])
    plan = outcome.plan
    lines.append(f"  {plan.reason}")
    rows = [
        (key, _value(key, value), plan.reasons.get(key, "").partition(": ")[2])
        for key, value in plan.to_status().items()
        if key not in ("reason", "reasons", "feasible")
    ]
    width = max(len(key) for key, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines.append(f"  {'FIELD':{width}}  {'VALUE':{value_width}}  WHY")
    lines += [f"  {key:{width}}  {value:{value_width}}  {why}".rstrip() for key, value, why in rows]
    return "\n".join([*lines, ""])


def _value(key: str, value: Any) -> str:
    if key == "weightBytes":
        return f"{value / GIB:.1f} GiB"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
