"""`preheat` command line: one sub-command per part, each owned by its module.

Sub-command modules are imported lazily so `preheat simulate` and `preheat plan` never import kopf or
kubernetes, and `preheat operator` never imports matplotlib.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module, one-line help). Each module exposes `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("preheat.sim.cli", "replay a trace through Preheat and the baseline autoscalers"),
    "frontier": ("preheat.sim.frontier", "sweep every autoscaler's target utilization: cost to reach each SLO"),
    "plan": ("preheat.capacity", "capacity planner: memory by precision, replicas, cost per token"),
    "operator": ("preheat.controller.cli", "run the Kopf operator"),
    "crd": ("preheat.controller.crd", "print the InferenceEndpoint CRD generated from the spec models"),
    "activator": ("preheat.activator", "hold and count requests of an endpoint at zero, then forward them"),
}


def usage() -> str:
    lines = ["usage: preheat <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"preheat: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
