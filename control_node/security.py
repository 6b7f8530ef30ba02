"""Who may talk to a node: private ipc directories, loopback-only plaintext tcp, ZeroMQ CURVE.

Node side (``NodeSockets``): :func:`check_runtime_dir` for every ipc endpoint, :func:`ServerCurve` makes the
sensor SUB, action PUB and diagnostics PUB CURVE servers and starts a ZAP authenticator that admits only the
client public keys found in ``[security] allowed_clients``.

Client side (simulator, replay, record, top, tests): :func:`client_curve` reads ``[security]
client_secret_key`` and ``server_public_key`` from a node config and :func:`configure_client` applies them
to a socket before it connects. CURVE runs inside libzmq, so the compiled loop, which calls
``zmq_recv``/``zmq_send`` on the sockets' handles, needs no change: it only ever sees decrypted frames from
authenticated peers.

Key files are the ZeroMQ certificate files that ``zmq.auth.create_certificates`` writes (``control-node
keys``): ``NAME.key`` (public) and ``NAME.key_secret`` (public + secret, mode 0600).
"""
from __future__ import annotations

import os
import stat

from control_node.errors import UserError



# --------------------------------------------------------------------------------------------- files

def check_private_file(path: str, what: str) -> None:
    """Refuse a secret file that group or others may read (or write)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist. Fix: create it with `control-node keys --out DIR "
                        f"--name NAME` and point the config at it") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} {path} is not a regular file. Fix: point the config at the .key_secret file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        who = "others (world)" if mode & 0o007 else "its group"
        raise UserError(f"{what} {path} holds a secret key but is accessible by {who} (mode {mode:04o}). "
                        f"Fix: chmod 600 {path}")
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        raise UserError(f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}). "
                        f"Fix: chown it to the user running control-node, mode 600")


def load_secret(path: str, what: str) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a ``.key_secret`` certificate, after the permission check."""
    import zmq.auth
    check_private_file(path, what)
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as e:
        raise UserError(f"{what} {path} is not a ZeroMQ certificate ({e}). Fix: generate one with "
                        f"`control-node keys`") from None
    if not secret:
        raise UserError(f"{what} {path} holds no secret key (is it the public .key file?). Fix: point the "
                        f"config at NAME.key_secret")
    return public, secret


def load_public(path: str, what: str) -> bytes:
    import zmq.auth
    if not os.path.isfile(path):
        raise UserError(f"{what} {path} does not exist. Fix: copy the node's public key file (NAME.key, "
                        f"from `control-node keys`) to this machine and point the config at it")
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as e:
        raise UserError(f"{what} {path} is not a ZeroMQ certificate ({e}). Fix: use the NAME.key file "
                        f"written by `control-node keys`") from None
    return public


def check_allowed_dir(path: str) -> list[str]:
    """The allow-list directory: exists, not writable by others, holds at least one public key."""
    if not os.path.isdir(path):
        raise UserError(f"config field 'security.allowed_clients': {path} is not a directory. Fix: create it "
                        f"and copy each client's public key file (NAME.key) into it")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        raise UserError(f"config field 'security.allowed_clients': {path} is writable by group/others "
                        f"(mode {mode:04o}), so anyone could add a key. Fix: chmod 755 {path} (or 700)")
    keys = sorted(f for f in os.listdir(path) if f.endswith(".key"))
    if not keys:
        raise UserError(f"config field 'security.allowed_clients': {path} holds no public key files (*.key). "
                        f"Fix: copy each client's NAME.key into it (`control-node keys` writes them)")
    return keys


def generate_keypair(out_dir: str, name: str) -> tuple[str, str]:
    """Write ``out_dir/name.key`` (public, 0644) and ``out_dir/name.key_secret`` (0600)."""
    import zmq.auth
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    secret_path = os.path.join(out_dir, f"{name}.key_secret")
    old = os.umask(0o077)                      # the secret file is never readable by others, not even briefly
    try:
        public, secret = zmq.auth.create_certificates(out_dir, name)
    finally:
        os.umask(old)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    assert os.path.abspath(secret) == os.path.abspath(secret_path)
    return public, secret


# ------------------------------------------------------------------------------------- endpoints

def check_runtime_dir(path: str, endpoint: str, name: str, default_dir: str | None = None) -> None:
    """Create the directory of an ipc socket mode 0700; refuse one that group/others can enter.

    An existing directory with wider permissions is tightened only when it is the default runtime
    directory (``default_dir``) and ours; anything else is refused (it may be shared, e.g. /tmp).
    """
    d = os.path.dirname(path) or "."
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the directory {d} for the {name} endpoint {endpoint}: {e}. Fix: choose "
                        f"a writable directory in [endpoints]") from None
    st = os.stat(d)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        raise UserError(f"the directory {d} of the {name} endpoint {endpoint} belongs to uid {st.st_uid}, not to "
                        f"this user (uid {os.geteuid()}): its owner could replace the socket. Fix: use a directory "
                        f"of your own (mode 700) in [endpoints]")
    if mode & 0o077:
        if default_dir and os.path.abspath(d) == os.path.abspath(default_dir):
            os.chmod(d, 0o700)
            return
        raise UserError(f"the directory {d} of the {name} endpoint {endpoint} is accessible by group/others "
                        f"(mode {mode:04o}), so other users could connect to the node. Fix: chmod 700 {d}, or "
                        f"put the ipc endpoints in a private directory (the default {{runtime_dir}} is one)")


# ------------------------------------------------------------------------------------------ CURVE

class ServerCurve:
    """CURVE server keys plus a ZAP authenticator admitting only the allow-listed client keys."""

    def __init__(self, ctx, security: dict):
        import zmq.auth
        from zmq.auth.thread import ThreadAuthenticator
        self.public, self.secret = load_secret(security["server_secret_key"], "server secret key file "
                                               "(config field 'security.server_secret_key')")
        self.allowed_dir = security["allowed_clients"]
        self.allowed = check_allowed_dir(self.allowed_dir)
        for f in self.allowed:                  # fail now on a bad key file, not at a client's handshake
            try:
                zmq.auth.load_certificate(os.path.join(self.allowed_dir, f))
            except (ValueError, OSError) as e:
                raise UserError(f"config field 'security.allowed_clients': {os.path.join(self.allowed_dir, f)} "
                                f"is not a ZeroMQ public key file ({e}). Fix: remove it or replace it with a "
                                f"NAME.key written by `control-node keys`") from None
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=os.path.abspath(self.allowed_dir))

    def apply(self, sock) -> None:
        import zmq
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)

    def stop(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def client_curve(cfg: dict | None) -> dict | None:
    """Client CURVE options from a node config's [security] table, or None when CURVE is off.

    Returns ``{"public": ..., "secret": ..., "server": ...}`` (z85 bytes).
    """
    sec = (cfg or {}).get("security") or {}
    if not sec.get("curve"):
        return None
    csk, spk = sec.get("client_secret_key") or "", sec.get("server_public_key") or ""
    if not csk:
        raise UserError("config field 'security.client_secret_key' is empty but [security] curve = true. Fix: set "
                        "it to this client's NAME.key_secret (from `control-node keys`) whose NAME.key is in the "
                        "node's allowed_clients directory")
    if not spk:
        raise UserError("config field 'security.server_public_key' is empty but [security] curve = true. Fix: set "
                        "it to the node's public key file (NAME.key)")
    public, secret = load_secret(csk, "client secret key file (config field 'security.client_secret_key')")
    server = load_public(spk, "server public key file (config field 'security.server_public_key')")
    return {"public": public, "secret": secret, "server": server}


def configure_client(sock, curve: dict | None) -> None:
    """Make ``sock`` a CURVE client of the node (call before connect). ``curve=None``: plaintext."""
    if not curve:
        return
    import zmq
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve["secret"])
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve["public"])
    sock.setsockopt(zmq.CURVE_SERVERKEY, curve["server"])


def client_curve_from_config_path(config_path: str | None) -> dict | None:
    """:func:`client_curve` for a config file (default: the packaged node.toml). Reads the raw TOML (a
    client's config need not name the node's model); a missing or broken file is an error, never a silent
    fall-back to plaintext."""
    from control_node.config import read_toml
    from control_node.endpoints import default_config
    return client_curve(read_toml(config_path or default_config("node.toml")))
