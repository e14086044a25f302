"""SageMaker's ``/invocations`` answers the base, and says so, or refuses.

vLLM's ``/invocations`` dispatches a body to the completions, chat, pooling... handlers by
its shape, in process, past the split. An adapter named in its
``X-Amzn-SageMaker-Adapter-Identifier`` header is written into the body's ``model`` and
resolved there -- a cold load the residency guard never counts; without the header, a body
naming an adapter is answered by the base with 200, as if it were the adapter. So a keyless
request to ``/invocations`` that names anything but the base, by header or by ``model``, is
refused with 400 naming which (an adapter is asked for on ``/v1/completions`` or
``/v1/chat/completions``, where the split answers it); the rest runs as vLLM runs it, outside
the split (``qualified.outside_split``). The fleet's key passes as on every route.
"""

from __future__ import annotations

import json
from typing import Any

PATH = "/invocations"
ADAPTER_HEADER = b"x-amzn-sagemaker-adapter-identifier"
MAX_BODY_BYTES = 1024 * 1024
_ELSEWHERE = "an adapter is asked for on /v1/completions or /v1/chat/completions"


def refusal(headers: list[tuple[bytes, bytes]], body: bytes, is_base: Any) -> tuple[str, str] | None:
    """(message, the field) why this keyless request is refused, or None to let it run.
    ``is_base``: whether a model name is the base this replica serves."""
    if any(key.lower() == ADAPTER_HEADER for key, _ in headers):
        return f"/invocations answers the base only: {_ELSEWHERE}", ADAPTER_HEADER.decode()
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return None  # vLLM's own answer: a JSON decode error
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if model is not None and not (isinstance(model, str) and is_base(model)):
        return f"/invocations answers the base only, not {str(model)[:200]!r}: {_ELSEWHERE}", "model"
    return None


def base_names(app: Any) -> Any:
    """Whether a name is the base model of ``app``'s vLLM (False for every name until the
    server's state holds its models)."""
    models = getattr(getattr(app, "state", None), "openai_serving_models", None)
    if models is None:
        return lambda name: False
    return models.is_base_model
