"""The console's web application (Starlette, server-rendered Jinja2 templates).

Every value shown is user data (aliases, keys, values, reasons) and is escaped by the
templates' autoescaping. Mutating actions (rollback, pin) are POST forms that carry a
per-process token and are refused from another origin; each asks for an explicit
confirmation and is the same compare-and-set the CLI runs, refused with the same errors.
The console never shows the token it reads the DAL with.
"""

from __future__ import annotations

import hmac
import json
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from bulldozer.console import views
from bulldozer.errors import BulldozerError, InvalidArgumentError
from bulldozer.kv.client import KvClient
from bulldozer.sockets import LOOPBACK_HOSTS

__all__ = ["create_app"]

#: HTTP status of each error family (by its gRPC code, the error tree's one mapping)
_STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "UNAVAILABLE": 503,
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def create_app(client: KvClient, allowed_hosts: list[str] | None = None) -> Starlette:
    """The console over ``client`` (whose token and ACLs decide what it may read and do),
    answering only requests whose ``Host`` is one of ``allowed_hosts`` (default: loopback's
    names). A page on another site can point its own name at 127.0.0.1 (DNS rebinding): to the
    browser it is then that site's page, which may read the console and its form token, and
    ``Origin`` checks pass; its ``Host`` header is still its own name, which is refused."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    templates = Jinja2Templates(env=env)
    csrf = secrets.token_urlsafe(32)

    def signed(done: str) -> str:
        return hmac.new(csrf.encode(), done.encode(), "sha256").hexdigest()[:32]

    def done_url(name: str, done: str) -> str:
        """The alias page saying what an action did (signed: a link cannot make it say anything else)."""
        return f"/a/{name}?{urlencode({'done': done, 'sig': signed(done)})}"

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        done = request.query_params.get("done", "")
        message = done if done and hmac.compare_digest(request.query_params.get("sig", ""), signed(done)) else ""
        context = {"csrf": csrf, "store": client.store, "message": message, **context}
        return templates.TemplateResponse(request, name, context, status_code=status, headers=_HEADERS)

    def failure(request: Request, exc: BulldozerError, **context: Any) -> Response:
        status = _STATUS.get(exc.grpc_code, 500)
        return page(request, "error.html", status, error=str(exc), **context)

    def aliases(request: Request) -> Response:
        try:
            return page(request, "aliases.html", rows=views.aliases_page(client))
        except BulldozerError as exc:
            return failure(request, exc)

    def alias(request: Request) -> Response:
        name = request.path_params["alias"]
        try:
            return page(request, "alias.html", a=views.alias_page(client, name))
        except BulldozerError as exc:
            return failure(request, exc, alias=name)

    def version(request: Request) -> Response:
        from bulldozer.schema.compile import load_message_classes

        name, ref = request.path_params["alias"], request.path_params["ref"]
        try:
            record, data = views.version_page(client, name, ref)
        except BulldozerError as exc:
            return failure(request, exc, alias=name)
        lookup: dict[str, Any] = {"key": request.query_params.get("key", ""), "value": None, "error": ""}
        key_fields: list[str] = []
        if record.value_descriptor_set:
            try:
                key_cls, value_cls = load_message_classes(
                    record.value_descriptor_set, record.key_message, record.value_message
                )
            except BulldozerError as exc:  # a version another tool made, or an older DAL took
                return failure(request, exc, alias=name)
            key_fields = [f.name for f in key_cls.DESCRIPTOR.fields]
            if lookup["key"]:
                lookup.update(_lookup(client, record.alias, record.name, record, key_cls, value_cls, lookup["key"]))
        return page(request, "version.html", v=data, lookup=lookup, key_fields=key_fields)

    async def rollback(request: Request) -> Response:
        from bulldozer.versioning.rollback import generation_change
        from bulldozer.versioning.rollback import rollback as do_rollback

        name = request.path_params["alias"]
        form = await _checked_form(request, csrf)
        if isinstance(form, Response):
            return form
        try:
            if form.get("confirm", "") != name:
                raise InvalidArgumentError(f"type the alias name ({name}) to confirm the rollback")
            before, record = do_rollback(
                client, name, form.get("to") or None, form.get("reason", ""), expected=form.get("expect") or None
            )
            crossing = generation_change(client.describe(before), client.describe(record.namespace))
        except BulldozerError as exc:
            return failure(request, exc, alias=name)
        done = f"rolled back {name}: {before} → {record.namespace}" + (f"; {crossing}" if crossing else "")
        return RedirectResponse(done_url(name, done), status_code=303)

    async def pin(request: Request) -> Response:
        name = request.path_params["alias"]
        form = await _checked_form(request, csrf)
        if isinstance(form, Response):
            return form
        pinned = form.get("pinned") == "true"
        try:
            if form.get("confirm") != "yes":
                raise InvalidArgumentError("tick the confirmation to " + ("pin" if pinned else "unpin") + f" {name}")
            live = client.get_alias(name)
            if form.get("expect") and live.namespace != form.get("expect"):
                from bulldozer.errors import AliasConflictError

                raise AliasConflictError(f"{name} moved to {live.namespace} since the page was shown; look again")
            record = client.set_pin(name, pinned, form.get("reason", ""))
        except BulldozerError as exc:
            return failure(request, exc, alias=name)
        done = f"{name} → {record.namespace} is {'pinned' if record.pinned else 'not pinned'}"
        return RedirectResponse(done_url(name, done), status_code=303)

    def stylesheet(request: Request) -> Response:
        css = (Path(__file__).parent / "templates" / "console.css").read_text(encoding="utf-8")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    routes = [
        Route("/", aliases),
        Route("/console.css", stylesheet),
        Route("/a/{alias}", alias),
        Route("/a/{alias}/v/{ref}", version),
        Route("/a/{alias}/rollback", rollback, methods=["POST"]),
        Route("/a/{alias}/pin", pin, methods=["POST"]),
    ]
    hosts = allowed_hosts or list(LOOPBACK_HOSTS)
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])


async def _checked_form(request: Request, csrf: str) -> dict[str, str] | Response:
    """The form of a mutating request, or a 403 when it is cross-site: another origin
    (``Origin`` / ``Sec-Fetch-Site``) or a missing or wrong token."""
    origin = request.headers.get("origin")
    expected = f"{request.url.scheme}://{request.url.netloc}"
    site = request.headers.get("sec-fetch-site")
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    token = form.get("csrf", "")
    if (origin and origin != expected) or (site and site not in ("same-origin", "none")):
        return HTMLResponse("refused: a cross-site request", status_code=403, headers=_HEADERS)
    if not hmac.compare_digest(token.encode(), csrf.encode()):
        return HTMLResponse("refused: the form's token is missing or stale; reload the page", 403, headers=_HEADERS)
    return form


def _lookup(
    client: KvClient, alias: str, name: str, record: Any, key_cls: Any, value_cls: Any, text: str
) -> dict[str, Any]:
    """A key looked up in one version: the value as readable JSON, or a message."""
    from bulldozer.schema.decode import ReadableJson, parse_key

    readable = ReadableJson(record.value_descriptor_set)
    try:
        raw = client.get(readable.key_bytes(key_cls, parse_key(text)), alias=f"{alias}@{name}")
        if raw is None:
            return {"error": f"no value for that key in {name}"}
        return {"value": json.dumps(readable.decode(value_cls, raw), indent=2, ensure_ascii=False)}
    except BulldozerError as exc:
        return {"error": str(exc)}
