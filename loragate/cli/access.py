"""Commands over who may do what: ``token``, ``key``, ``sign`` and ``verify``.

A token is printed once, by ``token create``, and never again; a private key never enters
the registry (``key generate`` writes it 0600 beside its public half, ``key add``
registers only the public half, ``sign`` reads the private one from a file).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loragate.cli.output import EXIT_OK, emit, open_registry, write_secret_file
from loragate.registry.rules.access import SIGNING_KEY_ROLES, Role

MAX_KEY_BYTES = 64 * 1024


def _read_key(path: str, field: str) -> bytes:
    from loragate.registry.storage.bundle_files import read_regular_file  # pydantic: only when a key is read

    return read_regular_file(Path(path), MAX_KEY_BYTES, field=field)


def cmd_token_create(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        record, token = reg.create_token(args.role, args.holder, args.namespace, pipeline=args.pipeline)
    emit(args, {**record.as_dict(), "token": token}, token)
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        record = reg.revoke_token(args.token_id)
    emit(args, record.as_dict(), f"token {record.token_id} ({record.role.value}, {record.holder}) revoked")
    return EXIT_OK


def cmd_token_list(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        tokens = reg.list_tokens()
    lines = (
        f"{t.token_id}\t{t.role.value}\t{t.kind.value}\t{t.namespace or '*'}\t{t.holder}\t{t.status}" for t in tokens
    )
    emit(args, [t.as_dict() for t in tokens], lambda: "\n".join(lines))
    return EXIT_OK


def cmd_key_generate(args: argparse.Namespace) -> int:
    from loragate.registry.storage.signing import generate_key_pair, key_id  # cryptography: only here

    pair = generate_key_pair()
    out = Path(args.out)
    private = write_secret_file(out / "signing.key", pair.private_pem.decode())
    public = out / "signing.pub"
    public.write_bytes(pair.public_pem)
    payload = {"key_id": key_id(pair.public_pem), "private_key": str(private), "public_key": str(public.absolute())}
    emit(args, payload, f"{payload['key_id']}\nprivate key {private} (mode 0600), public key {public}")
    return EXIT_OK


def cmd_key_add(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        key, created = reg.add_signing_key(_read_key(args.public_key, "public_key"), args.role, args.holder)
    emit(args, {**key.as_dict(), "created": created}, f"{key.key_id} ({key.role.value}, {key.holder})")
    return EXIT_OK


def cmd_key_list(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        keys = reg.list_signing_keys()
    lines = (f"{k.key_id}\t{k.role.value}\t{k.holder}\t{k.status}" for k in keys)
    emit(args, [k.as_dict() for k in keys], lambda: "\n".join(lines))
    return EXIT_OK


def cmd_key_revoke(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        key = reg.revoke_signing_key(args.key_id)
    emit(args, key.as_dict(), f"key {key.key_id} revoked")
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        signature, created = reg.sign_version(args.version, _read_key(args.key, "key"))
    verb = "signed" if created else "already signed"
    emit(args, {**signature.as_dict(), "created": created}, f"{args.version} {verb} by {signature.key_id}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    with open_registry(args) as reg:
        signature = reg.verify_signature(args.version, Path(args.dir) if args.dir else None)
    emit(args, signature.as_dict(), f"{args.version}: signature by {signature.key_id} verifies")
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    roles = [r.value for r in Role]
    token = sub.add_parser("token", parents=[common], help="API tokens (admin)").add_subparsers(
        dest="token_command", required=True
    )
    p = token.add_parser("create", parents=[common], help="a new token, printed once")
    p.add_argument("--role", required=True, choices=roles)
    p.add_argument("--holder", required=True, help="the person or pipeline holding it (the audit log names it)")
    p.add_argument("--namespace", help="limit it to adapters matching this pattern, e.g. acme/*")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="a work pool's token: never issued an approval code, so it moves production only on a person's sign-off",
    )
    p.set_defaults(func=cmd_token_create)
    p = token.add_parser("revoke", parents=[common], help="revoke a token by its id")
    p.add_argument("token_id")
    p.set_defaults(func=cmd_token_revoke)
    p = token.add_parser("list", parents=[common], help="every token, without secrets")
    p.set_defaults(func=cmd_token_list)

    key = sub.add_parser("key", parents=[common], help="signing keys").add_subparsers(dest="key_command", required=True)
    p = key.add_parser("generate", parents=[common], help="a new EC key pair in a directory (nothing registered)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_key_generate)
    p = key.add_parser("add", parents=[common], help="register a public key for a role (admin)")
    p.add_argument("public_key", help="PEM file")
    p.add_argument("--role", required=True, choices=[r.value for r in SIGNING_KEY_ROLES])
    p.add_argument("--holder", required=True)
    p.set_defaults(func=cmd_key_add)
    p = key.add_parser("list", parents=[common], help="registered keys")
    p.set_defaults(func=cmd_key_list)
    p = key.add_parser("revoke", parents=[common], help="revoke a key (admin); its signatures stop counting")
    p.add_argument("key_id")
    p.set_defaults(func=cmd_key_revoke)

    p = sub.add_parser("sign", parents=[common], help="sign a validated version with a signing key (signing)")
    p.add_argument("version")
    p.add_argument("--key", required=True, help="private key PEM file")
    p.set_defaults(func=cmd_sign)
    p = sub.add_parser("verify", parents=[common], help="verify a version's signature")
    p.add_argument("version")
    p.add_argument("--dir", help="verify the copy in this directory (what a replica loads) instead of the store")
    p.set_defaults(func=cmd_verify)
