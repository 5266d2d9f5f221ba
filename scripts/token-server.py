#!/usr/bin/env python3
"""A throwaway Docker-style token server for the Distribution registry.

It implements the anonymous and Basic-auth halves of the token flow that
Docker Hub uses (registry answers 401 with a Bearer challenge, the client GETs
the realm with service and scope, gets {"token", "access_token"} and retries),
so tests can check that nanolet really performs that flow against a real
registry. Only the Python standard library is used; RS256 signing is done by
the openssl command line because the stdlib has no RSA.

Usage: scripts/token-server.py --init DIR
         (writes DIR/token.key and DIR/token.crt, a fresh self-signed pair)
       scripts/token-server.py --key FILE --cert FILE [--issuer NAME]
         [--user USER:PASSWORD] [--port N] [--port-file FILE]
         [--request-log FILE] [--ttl SECONDS] [--header x5c|kid]
         [--private PREFIX ...]
Serves on 127.0.0.1 only and prints 127.0.0.1:PORT once listening.

  GET  /token?service=S&scope=repository:NAME:ACTIONS[&scope=...]
         token for S; anonymous callers get pull only (nothing for
         repositories under a --private prefix), HTTP Basic auth
         matching --user gets pull and push, wrong credentials get 401
  POST /token   the same as an OAuth2 password grant (form fields
         grant_type=password, username, password, service, scope), which
         containerd-style clients try first when they hold credentials
  GET  /count   number of requests served so far, not counting /count

Each request except /count is appended to --request-log (started afresh) as
one line: "N METHOD PATH authorization=yes|no sub=USER|- status=CODE
access=TYPE:NAME:ACTIONS;...". N is the same number /count reports.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANON_ACTIONS = ("pull",)
USER_ACTIONS = ("pull", "push")


def die(msg):
    print(f"token-server.py: {msg}", file=sys.stderr)
    sys.exit(1)


def openssl(*args, data=None):
    try:
        proc = subprocess.run(
            ["openssl", *args], input=data, capture_output=True, check=False
        )
    except FileNotFoundError:
        die("openssl not found")
    if proc.returncode != 0:
        raise RuntimeError(
            f"openssl {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def init(directory):
    os.makedirs(directory, exist_ok=True)
    # Generate beside the targets and rename, so a registry never reads a
    # half-written bundle and a key never sits world-readable, even briefly.
    with tempfile.TemporaryDirectory(dir=directory, prefix=".token-init.") as tmp:
        key, crt = os.path.join(tmp, "token.key"), os.path.join(tmp, "token.crt")
        old = os.umask(0o077)
        try:
            openssl(
                "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                "-keyout", key, "-out", crt, "-days", "3650",
                "-subj", "/CN=nanolet-test-token-signer",
            )
        finally:
            os.umask(old)
        # The registry reads the certificate as whatever user it runs as.
        os.chmod(crt, 0o644)
        os.replace(key, os.path.join(directory, "token.key"))
        os.replace(crt, os.path.join(directory, "token.crt"))


def libtrust_key_id(pub_der):
    # docker/libtrust's KeyID: SHA-256 of the DER SubjectPublicKeyInfo, cut to
    # 240 bits, base32, in colon-separated groups of four. The registry keys
    # its "kid" lookup table on this for every certificate in rootcertbundle.
    b32 = base64.b32encode(hashlib.sha256(pub_der).digest()[:30]).decode()
    return ":".join(b32[i : i + 4] for i in range(0, len(b32), 4))


class Signer:
    def __init__(self, key, cert, header_kind):
        self.key = key
        cert_der = openssl("x509", "-in", cert, "-outform", "DER")
        cert_pub = openssl("x509", "-in", cert, "-noout", "-pubkey")
        pub_der = openssl("pkey", "-pubin", "-outform", "DER", data=cert_pub)
        key_pub = openssl("pkey", "-in", key, "-pubout", "-outform", "DER")
        # A mismatched pair would only show up as the registry rejecting every
        # token with a vague "invalid token"; fail loudly here instead.
        if key_pub != pub_der:
            die(f"{key} does not belong to {cert}")
        header = {"typ": "JWT", "alg": "RS256"}
        if header_kind == "x5c":
            header["x5c"] = [base64.b64encode(cert_der).decode()]
        else:
            header["kid"] = libtrust_key_id(pub_der)
        self.header = b64url(json.dumps(header, separators=(",", ":")).encode())

    def sign(self, claims):
        body = self.header + "." + b64url(
            json.dumps(claims, separators=(",", ":")).encode()
        )
        # `openssl dgst -sha256 -sign` with an RSA key is PKCS#1 v1.5 over
        # SHA-256, which is exactly JWS RS256.
        sig = openssl("dgst", "-sha256", "-sign", self.key, data=body.encode())
        return body + "." + b64url(sig)


def parse_scope(scope):
    # type[(class)]:name:actions; a name may itself contain colons (a
    # registry host:port), so the type ends at the first colon and the
    # actions start after the last.
    rtype, sep1, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    if not (sep1 and sep2 and rtype and name):
        return None
    return rtype, name, [a for a in actions.split(",") if a]


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, opts, signer, log):
        super().__init__(addr, Handler)
        self.opts = opts
        self.signer = signer
        self.log = log
        self.lock = threading.Lock()
        self.count = 0
        user, _, password = (opts.user or "").partition(":")
        self.user = user.encode() if opts.user else None
        self.password = password.encode()

    def record(self, method, path, authorization, sub, status, access):
        with self.lock:
            self.count += 1
            if self.log:
                granted = ";".join(
                    f"{a['type']}:{a['name']}:{','.join(a['actions'])}" for a in access
                )
                self.log.write(
                    f"{self.count} {method} {path} authorization={'yes' if authorization else 'no'}"
                    f" sub={sub or '-'} status={status} access={granted or '-'}\n"
                )
                # Tests read the log right after a pull; do not leave it buffered.
                self.log.flush()

    def check_user(self, user, password):
        # Returns the subject: "" for anonymous, the user name when the
        # credentials match, None when they were given and are wrong.
        if user is None:
            return ""
        if (
            self.user is not None
            and hmac.compare_digest(user.encode(), self.user)
            and hmac.compare_digest(password.encode(), self.password)
        ):
            return user
        return None


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so clients that keep connections alive are served as they
    # would be by a real token service; every reply sets Content-Length.
    protocol_version = "HTTP/1.1"
    server_version = "nanolet-token-server"

    def reply(self, status, body, ctype="application/json", extra=()):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/count":
            with self.server.lock:
                n = self.server.count
            self.reply(200, f"{n}\n", "text/plain")
            return
        if url.path != "/token":
            self.respond(404, '{"details":"not found"}', None, [])
            return
        query = urllib.parse.parse_qs(url.query)
        user = password = None
        auth = self.headers.get("Authorization")
        if auth and auth[:6].lower() == "basic ":
            try:
                raw = base64.b64decode(auth[6:].strip(), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                self.respond(400, '{"details":"malformed Basic credentials"}', None, [])
                return
            user, _, password = raw.partition(":")
        service = query.get("service", [""])[0]
        self.issue(service, query.get("scope", []), user, password, oauth=False)

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(length).decode(errors="replace"))
        if url.path != "/token":
            self.respond(404, '{"details":"not found"}', None, [])
            return
        if form.get("grant_type", [""])[0] != "password":
            self.respond(400, '{"error":"unsupported_grant_type"}', None, [])
            return
        # OAuth2 joins several scopes with spaces in one field.
        scopes = [s for f in form.get("scope", []) for s in f.split(" ") if s]
        self.issue(
            form.get("service", [""])[0],
            scopes,
            form.get("username", [""])[0],
            form.get("password", [""])[0],
            oauth=True,
        )

    def issue(self, service, scopes, user, password, oauth):
        sub = self.server.check_user(user, password)
        if sub is None:
            self.respond(
                401,
                '{"details":"incorrect username or password"}',
                user,
                [],
                [("WWW-Authenticate", 'Basic realm="nanolet-test-token-server"')],
            )
            return
        allowed = USER_ACTIONS if sub else ANON_ACTIONS
        # Clients repeat scopes (skopeo sends the same one twice on a push),
        # so merge per repository; dicts keep the order they were asked in.
        wanted = {}
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed is None:
                self.respond(400, json.dumps({"details": f"invalid scope: {scope}"}), sub, [])
                return
            rtype, name, actions = parsed
            if rtype != "repository":
                continue  # e.g. registry:catalog:*, never granted here
            wanted.setdefault(name, {}).update(dict.fromkeys(actions))
        access = []
        for name, actions in wanted.items():
            private = any(name.startswith(p) for p in self.server.opts.private)
            granted = [a for a in actions if a in allowed and (sub or not private)]
            if granted:
                access.append({"type": "repository", "name": name, "actions": granted})
        now = int(time.time())
        claims = {
            "iss": self.server.opts.issuer,
            "sub": sub,
            "aud": service,
            "exp": now + self.server.opts.ttl,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": access,
        }
        try:
            token = self.server.signer.sign(claims)
        except RuntimeError as e:
            self.log_message("%s", e)
            self.respond(500, '{"details":"signing failed"}', sub, [])
            return
        body = {
            "access_token": token,
            "expires_in": self.server.opts.ttl,
            "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        }
        if not oauth:
            # Docker's token spec names it "token"; "access_token" is the
            # OAuth2 name that newer clients prefer. Hub sends both.
            body["token"] = token
        self.respond(200, json.dumps(body), sub, access)

    def respond(self, status, body, sub, access, extra=()):
        # Record before replying, so a client that has its answer can rely on
        # the log line and /count already reflecting the request.
        self.server.record(
            self.command, self.path, "Authorization" in self.headers, sub, status, access
        )
        self.reply(status, body, extra=extra)


def main():
    p = argparse.ArgumentParser(
        description="Docker-style Bearer token server for a loopback test registry."
    )
    p.add_argument("--init", metavar="DIR", help="write DIR/token.key and DIR/token.crt, then exit")
    p.add_argument("--key", help="PEM RSA private key that signs tokens")
    p.add_argument("--cert", help="PEM certificate of that key (the registry's rootcertbundle)")
    p.add_argument("--issuer", default="nanolet-test-issuer", help="iss claim (default %(default)s)")
    p.add_argument("--user", metavar="USER:PASSWORD", help="credentials that get pull and push")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--port-file", help="write the port here (atomically) once listening")
    p.add_argument("--request-log", help="append one line per request here (truncated at start)")
    p.add_argument(
        "--private", action="append", default=[], metavar="PREFIX",
        help="repositories under PREFIX: no anonymous access (repeatable)",
    )
    p.add_argument("--ttl", type=int, default=300, help="token lifetime in seconds (default %(default)s)")
    p.add_argument(
        "--header", choices=("x5c", "kid"), default="x5c",
        help="how the JWT names its key: the certificate itself, or a libtrust key id",
    )
    opts = p.parse_args()

    if opts.init:
        try:
            init(opts.init)
        except RuntimeError as e:
            die(str(e))
        return
    if not (opts.key and opts.cert):
        p.error("--key and --cert are required unless --init is given")
    if opts.user is not None and ":" not in opts.user:
        p.error("--user must be USER:PASSWORD")

    try:
        signer = Signer(opts.key, opts.cert, opts.header)
    except RuntimeError as e:
        die(str(e))
    log = open(opts.request_log, "w", encoding="utf-8") if opts.request_log else None
    # Binding port 0 here, rather than probing for a free port first, leaves
    # no window for another process to take it.
    server = Server(("127.0.0.1", opts.port), opts, signer, log)
    port = server.server_address[1]
    if opts.port_file:
        # The socket already listens, so once this file exists a caller can
        # connect; the rename means it never sees a partial number.
        tmp = f"{opts.port_file}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{port}\n")
        os.replace(tmp, opts.port_file)
    print(f"127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
