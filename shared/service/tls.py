"""TLS for both ``serve`` commands: uvicorn serves HTTPS when given a certificate and its key."""

from __future__ import annotations

import os

from shared.errors import ErrorCode, LabelDPError


def add_tls_arguments(parser) -> None:
    parser.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", default=None, help="... and this private key (PEM)")


def tls_options(args) -> dict:
    """uvicorn's keyword arguments for the flags (none without them)."""
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise LabelDPError("--ssl-certfile and --ssl-keyfile go together", code=ErrorCode.USAGE)
    if not args.ssl_certfile:
        return {}
    for flag, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if not os.access(path, os.R_OK):
            raise LabelDPError(f"{flag}: cannot read {path}", code=ErrorCode.USAGE)
    return {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile}
