"""A qualified name (``name@version``) reaches a version only when loragate chose it.

The split answers its share of users from a version warm under ``name@version``; the fleet
probes and verifies warm copies by that name. Every other caller must not name a version:
vLLM resolves a request's ``model`` on every inference route it has (completions, chat,
responses, messages, tokenize, invocations, render, generate, pooling, audio...), by body,
form field or SageMaker header alike, through one table (``OpenAIServingModels.
lora_requests``) and one fallback (``resolve_lora``, which asks the resolvers).

So the guard sits there, not in front of each route: a qualified name is invisible in that
table and never resolved unless the request runs under ``chosen()`` -- set by the split for
the request it forwards and by the admin guard for the fleet's own requests (its key). A
``ContextVar`` carries that from the middleware to the handler: the handler runs in the
middleware's task, or in tasks that copy its context. Installed from the plugin's
``register`` into the API server; another vLLM (no such class) is left as it is, and the
admin guard refuses to treat the replica as guarded.

The same table keeps every adapter, plain names included, from the inference routes outside
the split (``outside_split()``, set by the admin guard for a keyless request on one of them):
an adapter answers a client only where the split and the residency guard see the request,
so no route loads adapters past the guard's cap or a tenant's share.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

QUALIFIER = "@"
_chosen: ContextVar[bool] = ContextVar("loragate_qualified_chosen", default=False)
_outside: ContextVar[bool] = ContextVar("loragate_outside_split", default=False)
_installed = False

log = logging.getLogger("loragate_resolver.qualified")


def is_qualified(name: object) -> bool:
    return isinstance(name, str) and QUALIFIER in name


def allowed(name: object) -> bool:
    """Whether this request may reach the adapter ``name``: under ``chosen()`` any; outside the
    split none; otherwise any plain name."""
    if _chosen.get():
        return True
    return not (_outside.get() or is_qualified(name))


@contextlib.contextmanager
def chosen() -> Iterator[None]:
    """The request run inside was chosen by loragate (the split, or the fleet's key)."""
    token = _chosen.set(True)
    try:
        yield
    finally:
        _chosen.reset(token)


@contextlib.contextmanager
def outside_split() -> Iterator[None]:
    """The request run inside reached an inference route the split does not see."""
    token = _outside.set(True)
    try:
        yield
    finally:
        _outside.reset(token)


class GuardedAdapters(dict):
    """vLLM's name -> LoRA request table, where a qualified name is not there for a request
    loragate did not choose. Writes and iteration (``/v1/models``) are the dict's own."""

    def __contains__(self, name: object) -> bool:
        return allowed(name) and dict.__contains__(self, name)

    def __getitem__(self, name: Any) -> Any:
        if not allowed(name):
            raise KeyError(name)
        return dict.__getitem__(self, name)

    def get(self, name: Any, default: Any = None) -> Any:
        return dict.get(self, name, default) if allowed(name) else default


def install() -> bool:
    """Guard vLLM's adapter table and its resolver fallback; True when installed (or already)."""
    global _installed
    if _installed:
        return True
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.entrypoints.serve import create_error_response
    except Exception:  # another vLLM: nothing patched, and installed() says so
        log.warning("loragate: vLLM's OpenAIServingModels not found; qualified names are not guarded")
        return False
    from http import HTTPStatus

    def get_table(self: Any) -> dict:
        return self.__dict__["_loragate_adapters"]

    def set_table(self: Any, value: dict) -> None:
        self.__dict__["_loragate_adapters"] = GuardedAdapters(value)

    original_resolve = OpenAIServingModels.resolve_lora

    async def resolve_lora(self: Any, lora_name: str) -> Any:
        if not allowed(lora_name):
            return create_error_response(
                message=f"LoRA adapter {lora_name} does not exist",
                err_type="NotFoundError",
                status_code=HTTPStatus.NOT_FOUND,
            )
        return await original_resolve(self, lora_name)

    # a data descriptor on the class: __init__'s ``self.lora_requests = {}`` goes through it
    OpenAIServingModels.lora_requests = property(get_table, set_table)  # type: ignore[assignment]
    OpenAIServingModels.resolve_lora = resolve_lora  # type: ignore[method-assign]
    _installed = True
    return True


def installed() -> bool:
    return _installed
