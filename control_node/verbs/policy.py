"""control-node policy VERB: load, switch, shadow and roll back the policies of a running node."""

HELP = {
    "load": "load NAME FILE: read, verify and lay out FILE (.npz, .onnx, .pt) off the loop, resident as NAME",
    "activate": "activate NAME [--canary]: make NAME the active policy at the next cycle boundary",
    "shadow": "shadow NAME: run NAME beside the active policy on the same input; compare, never publish",
    "unshadow": "unshadow: stop the shadow policy",
    "rollback": "rollback: back to the policy active before the last switch (ends a canary)",
    "unload": "unload NAME: free a resident policy that is neither active nor shadow",
    "status": "status: active, previous, shadow, canary, resident policies and the last transitions",
}


def register(sub):
    p = sub.add_parser("policy", help="load, activate, shadow, roll back policies of a running node",
                       description="Talk to a running node's control endpoint ([endpoints] control of --config; "
                                   "default <sensor endpoint>_control). Loading and verifying happen on the node's "
                                   "lifecycle thread, never on the loop; the loop switches between two cycles by "
                                   "one pointer exchange. A refused request changes nothing, says why, and exits "
                                   "1. Messages: docs/protocol.md (Control).",
                       epilog="\n".join(HELP.values()))
    verbs = p.add_subparsers(dest="policy_verb", metavar="VERB", required=True)
    for verb, text in HELP.items():
        v = verbs.add_parser(verb, help=text.split(": ", 1)[1], description=text)
        if verb in ("load", "activate", "shadow", "unload"):
            v.add_argument("name", metavar="NAME", help="the policy's name (letters, digits, _ - .)")
        if verb == "load":
            v.add_argument("file", metavar="FILE", help="model file: .npz (control-node train/import), .onnx, .pt")
        if verb == "activate":
            v.add_argument("--canary", action="store_true",
                           help="staged roll-out: the old policy runs in shadow, the loop rolls back by the "
                                "[rollout] rules (non-finite output, cycle-time budget, disagreement), promotes "
                                "after rollout.canary_s")
        v.add_argument("--config", metavar="FILE", help="the node's config (endpoints, CURVE keys); default: the "
                                                        "packaged node.toml")
        v.add_argument("--endpoint", metavar="EP", help="the node's control endpoint (overrides --config)")
        v.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="seconds to wait for the reply (default: %(default)s; a load verifies the file first)")
        v.add_argument("--json", action="store_true", help="print the whole reply as JSON")
    return p


def _print_status(st):
    print(f"active   {st['active']}" + (f"  (canary: {st['canary']['ticks_done']}/{st['canary']['ticks_to_promote']} "
                                        f"policy ticks)" if st.get("canary") else ""))
    print(f"previous {st['previous'] or '-'}")
    print(f"shadow   {st['shadow'] or '-'}")
    sf = st.get("shadow_figures")
    if sf and sf["ticks"]:
        cost = sf["cost_ns"]
        dist = sf.get("distance")
        print(f"         {sf['ticks']} ticks, {sf['disagree']} disagree ({sf['disagree_rate']:.1%}), "
              f"{sf['non_finite']} non-finite; cost mean {cost['mean'] / 1e3:.1f} us max {cost['max'] / 1e3:.1f} us"
              + (f"; distance p50 {dist['p50']:.3g} p99 {dist['p99']:.3g} max {dist['max']:.3g}" if dist else ""))
    print(f"resident {len(st['policies'])}/{st['max_policies']} policies, "
          f"{st['resident_bytes'] / 2**20:.2f} of {st['max_resident_bytes'] / 2**20:g} MB:")
    from control_node.kernels.weights import describe
    for r in st["policies"]:
        print(f"  {r['name']:<16} {r['role']:<8} {r['kind']:<10} {' -> '.join(map(str, r['layers']))} "
              f"{r['dtype']}{' ' + r['recurrent'] if r['recurrent'] else ''}  sha256 {r['sha256'][:12]}  {r['path']}")
        from control_node.rundir import copy_line
        print(f"  {'':<16} {copy_line(r.get('copy')) or 'kernel copy: not recorded'}")
        print(f"  {'':<16} weights {describe(r.get('weights_error')) if r.get('weights', 'f32') != 'f32' else 'f32 (exact)'}"
              f", {r['nbytes'] / 1024:.0f} KiB resident")
    print(f"transitions ({st['transition_count']}, last {len(st['transitions'])}):")
    for e in st["transitions"]:
        print(f"  cycle {e['cycle']:>9}  {e['event']:<13} {e['policy'] or '-':<16} "
              + (f"from {e['from']:<12} " if e.get("from") else "") + f"({e['reason']})")


def run(args):
    import json
    import os

    from control_node.config import client_endpoints
    from control_node.lifecycle import PolicyClient
    from control_node.security import client_curve_from_config_path
    endpoint = args.endpoint or client_endpoints(args.config)["control"]
    msg = {"op": args.policy_verb}
    if getattr(args, "name", None) is not None:
        msg["name"] = args.name
    if args.policy_verb == "load":
        msg["path"] = os.path.abspath(args.file)
    if args.policy_verb == "activate":
        msg["canary"] = bool(args.canary)
    with PolicyClient(endpoint, client_curve_from_config_path(args.config), timeout=args.timeout) as client:
        reply = client.request(msg)
    if args.json:
        print(json.dumps(reply, indent=2, default=str))
    elif args.policy_verb == "status":
        _print_status(reply["status"])
    else:
        print(("" if reply["ok"] else f"refused ({reply['error']}): ") + reply["message"])
    return 0 if reply["ok"] else 1
