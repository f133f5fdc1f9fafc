"""The worker's reply format: JSON authenticated with an HMAC under a per-worker key.

The parent never unpickles what a worker sends (a candidate that took over the worker could send
a pickle that runs code in the graph process), and a reply needs the key, which only the worker
loop's frame holds, so a candidate writing to the reply pipe cannot forge a "verified" result.
"""
from __future__ import annotations

import hashlib
import hmac
import json


def encode_reply(key: bytes, message) -> bytes:
    body = json.dumps(message, default=str).encode("utf-8")
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode("ascii") + b"\n" + body


def decode_reply(key: bytes, blob: bytes):
    """Parent side: the message, or ValueError when the blob was not written by the worker loop."""
    mac, _, body = blob.partition(b"\n")
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).hexdigest().encode("ascii")):
        raise ValueError("reply failed authentication (not written by the worker loop)")
    return json.loads(body.decode("utf-8"))
