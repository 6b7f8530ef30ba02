"""``control-node``: one command, ROS-style verbs.

Each verb lives in ``control_node/verbs/<verb>.py`` and provides
``register(subparsers)`` (argparse only, cheap to import) and ``run(args) -> int``
(heavy imports inside). Verbs are listed here in ``--help`` order.
"""
from __future__ import annotations

import argparse
import importlib
import sys

VERBS = ["run", "launch", "sim", "record", "replay", "export", "report", "top", "hz", "echo", "live",
         "train", "import", "deploy-config", "policy", "mode", "bench", "keys", "doctor", "bridge"]
# a verb that is a Python keyword or holds a dash lives in a module of another name
MODULES = {"import": "importer", "deploy-config": "deploy_config"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="control-node",
        description="Real-time control-loop node: a fixed-rate loop over ZeroMQ running a compiled MLP policy.",
        epilog="Run `control-node VERB --help` for each verb's options.")
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        name = MODULES.get(verb, verb)
        try:
            module = importlib.import_module(f"control_node.verbs.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"control_node.verbs.{name}":
                continue  # verb not built yet
            raise
        parser = module.register(sub)
        parser.set_defaults(func=module.run)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from control_node.kernels import ConsistencyError, ModelFileError
    from control_node.kernels.importers import ImportRefused

    from control_node.errors import UserError
    try:
        return args.func(args) or 0
    except (ModelFileError, ConsistencyError, UserError, ImportRefused) as e:
        print(f"control-node {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
