"""control-node keys: generate a CURVE keypair (ZeroMQ certificate files) for a node or a client."""


def register(sub):
    p = sub.add_parser("keys", help="generate a CURVE keypair for a node or a client (tcp across hosts)",
                       description="Write OUT/NAME.key (public: give it to the peer) and OUT/NAME.key_secret "
                                   "(public + secret, mode 0600: keep it on this machine). The node's config "
                                   "points [security] server_secret_key at its .key_secret and allowed_clients at "
                                   "a directory of client .key files; a client's config points client_secret_key "
                                   "at its .key_secret and server_public_key at the node's .key. "
                                   "See docs/deployment.md.")
    p.add_argument("--out", default="keys", help="directory to write into (created mode 0700; default: %(default)s)")
    p.add_argument("--name", required=True, help="key name, e.g. node or robot1 (files NAME.key, NAME.key_secret)")
    p.add_argument("--force", action="store_true", help="overwrite an existing keypair of that name")
    return p


def run(args):
    import os
    import re

    from control_node.errors import UserError
    from control_node.security import generate_keypair
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name) or args.name.startswith("."):
        raise UserError(f"--name {args.name!r}: use letters, digits, '_', '-' or '.' (it becomes a file name)")
    for suffix in (".key", ".key_secret"):
        path = os.path.join(args.out, args.name + suffix)
        if os.path.exists(path) and not args.force:
            raise UserError(f"{path} already exists. Fix: choose another --name, or pass --force to replace the "
                            f"keypair (peers holding the old public key must get the new one)")
    try:
        public, secret = generate_keypair(args.out, args.name)
    except OSError as e:
        raise UserError(f"cannot write keys to {args.out}: {e}. Fix: choose a writable --out directory") from None
    print(f"public key  {public}  (give to peers: a node's goes to clients' server_public_key, "
          f"a client's into the node's allowed_clients directory)")
    print(f"secret key  {secret}  (mode 0600, keep private: server_secret_key or client_secret_key)")
    return 0
