"""control-node mode MODE: switch a running legged node between passive, damping, stand and policy."""

MODES_HELP = ("passive: no command (zero torque); damping: kp = 0, kd per joint; stand: a linear ramp from the "
              "measured pose to the default pose with the stand gains; policy: the policy's targets tracked by the "
              "PD (refused until a stand has completed, unless [legged.modes] policy_without_stand)")


def register(sub):
    p = sub.add_parser("mode", help="switch a legged node's mode (passive, damping, stand, policy)",
                       description="Ask a running node with a [legged] recipe for a mode, through its control "
                                   "endpoint; the loop takes it at the next cycle boundary and records the "
                                   "transition (summary.json's legged.transitions, the report's mode timeline). "
                                   "A refused request changes nothing, says why, and exits 1. " + MODES_HELP + ".")
    p.add_argument("mode", metavar="MODE", nargs="?", choices=("passive", "damping", "stand", "policy"),
                   help="passive, damping, stand or policy; none: print the current mode")
    p.add_argument("--config", metavar="FILE", help="the node's config (endpoints, CURVE keys); default: the "
                                                    "packaged node.toml")
    p.add_argument("--endpoint", metavar="EP", help="the node's control endpoint (overrides --config)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for the reply")
    p.add_argument("--json", action="store_true", help="print the whole reply as JSON")
    return p


def run(args):
    import json

    from control_node.config import client_endpoints
    from control_node.lifecycle import PolicyClient
    from control_node.security import client_curve_from_config_path
    endpoint = args.endpoint or client_endpoints(args.config)["control"]
    msg = {"op": "mode", "mode": args.mode} if args.mode else {"op": "status"}
    with PolicyClient(endpoint, client_curve_from_config_path(args.config), timeout=args.timeout) as client:
        reply = client.request(msg)
    if args.json:
        print(json.dumps(reply, indent=2, default=str))
    elif not args.mode:
        lg = reply["status"].get("legged")
        print(f"mode {lg['mode']} (stand {'completed' if lg['stand_done'] else 'not completed'}, output "
              f"{lg['output']})" if lg else "this node runs no [legged] recipe")
    else:
        print(("" if reply["ok"] else f"refused ({reply['error']}): ") + reply["message"])
    return 0 if reply["ok"] else 1
