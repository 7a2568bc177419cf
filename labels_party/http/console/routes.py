"""The console's pages and forms. Thin like the API's routers: the gate (:mod:`labels_party.http.console.gate`) has
already authenticated the session, bounded the body and checked the origin; a route calls one function of
:mod:`labels_party.http.console.views` (which calls the service) and renders a template. Errors become HTML pages with
the service's own statuses (:mod:`labels_party.http.console.app`)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from labels_party.http.auth import Principal
from labels_party.http.console import charts, sessions, views
from labels_party.http.console.sessions import PATH
from labels_party.runtime.context import ServiceContext
from shared.errors import ErrorCode, LabelDPError, status_of
from shared.service import dependencies


def signed_in(request: Request) -> Principal:
    """The principal of the console session the console's gate found (every page but sign-in has one)."""
    found = request.scope.get("state", {}).get("principal")
    if found is None:
        raise LabelDPError("sign in to the console first", code=ErrorCode.UNAUTHORIZED)
    return found


Auth = Annotated[Principal, Depends(signed_in)]
Context = Annotated[ServiceContext, Depends(dependencies.context)]

router = APIRouter(include_in_schema=False)

FORM = "application/x-www-form-urlencoded"


def render(request: Request, template: str, *, status: int = 200, **values) -> HTMLResponse:
    """A page: the template with the signed-in principal, the session's CSRF token and the chart helpers."""
    state = request.scope.get("state", {})
    html = request.app.state.templates.get_template(template).render(
        principal=state.get("principal"), csrf=state.get("csrf", ""), prefix=PATH, charts=charts, **values)
    return HTMLResponse(html, status_code=status)


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a urlencoded form (the gate has bounded the body to a few KB)."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != FORM:
        raise LabelDPError(f"console forms are sent as {FORM}", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    body = await request.body()
    try:
        return dict(parse_qsl(body.decode("ascii"), keep_blank_values=True, max_num_fields=8, errors="strict"))
    except (UnicodeDecodeError, ValueError) as err:
        raise LabelDPError("malformed form", code=ErrorCode.INVALID_INPUT) from err


def check_csrf(request: Request, fields: dict[str, str]) -> None:
    token = request.scope["state"]["console_token"]
    if not sessions.csrf_matches(token, fields.get("csrf")):
        raise LabelDPError("this form does not carry this session's CSRF token; reload the page",
                           code=ErrorCode.FORBIDDEN)


@router.get("/")
def home():
    return RedirectResponse(f"{PATH}/datasets", status_code=303)


@router.get("/static/{name}")
def static(name: str, request: Request):
    """The style sheet and the icon (public: they carry nothing of anyone's)."""
    if name not in request.app.state.static:
        raise LabelDPError("no such file", code=ErrorCode.NOT_FOUND)
    content, media_type = request.app.state.static[name]
    return Response(content, media_type=media_type)


@router.get("/sign-in")
def sign_in_page(request: Request):
    return render(request, "sign_in.html", title="Sign in")


@router.post("/sign-in")
async def sign_in(request: Request):
    """Exchange an admin API key for a console session; the key itself goes no further than this check."""
    fields = await read_form(request)
    try:
        token, _ = await run_in_threadpool(request.app.state.sessions.sign_in, fields.get("api_key", ""))
    except LabelDPError as err:
        if err.code not in ("unauthorized", "forbidden"):
            raise
        message = ("That is not a valid API key." if err.code == "unauthorized"
                   else "The console is for admin keys of a dataset owner; this key is a consumer's.")
        return render(request, "sign_in.html", status=status_of(err.code), title="Sign in", error=message)
    previous = request.cookies.get(sessions.COOKIE)
    if previous:  # signing in again replaces the browser's session instead of leaving it behind
        await run_in_threadpool(request.app.state.sessions.sign_out, previous)
    response = RedirectResponse(f"{PATH}/datasets", status_code=303)
    lifetime = int(request.app.state.sessions.lifetime.total_seconds())
    response.headers.append("set-cookie", sessions.cookie_header(token, secure=request.url.scheme == "https",
                                                                 max_age=lifetime))
    return response


@router.post("/sign-out")
async def sign_out(request: Request):
    fields = await read_form(request)
    check_csrf(request, fields)
    await run_in_threadpool(request.app.state.sessions.sign_out, request.scope["state"]["console_token"])
    response = RedirectResponse(f"{PATH}/sign-in", status_code=303)
    response.headers.append("set-cookie", sessions.cookie_header("", secure=request.url.scheme == "https",
                                                                 max_age=0))
    return response


@router.get("/datasets")
def datasets(request: Request, who: Auth, ctx: Context):
    return render(request, "datasets.html", title="Datasets", cards=views.datasets_overview(ctx, who))


@router.get("/datasets/{dataset_id}")
def dataset(dataset_id: str, request: Request, who: Auth, ctx: Context):
    page = views.dataset_page(ctx, who, dataset_id)
    return render(request, "dataset.html", title=page.dataset.name, page=page)


@router.post("/datasets/{dataset_id}/verify")
async def verify(dataset_id: str, request: Request, who: Auth, ctx: Context):
    """Recompute the dataset's audit from the ledger alone (``labeldp labels verify-audit``)."""
    fields = await read_form(request)
    check_csrf(request, fields)
    chain_valid, report = await run_in_threadpool(views.verify, ctx, who, dataset_id)
    return render(request, "verify.html", title=f"Audit of {report['name']}", dataset_id=dataset_id,
                  chain_valid=chain_valid, report=report)


@router.get("/releases/{release_id}")
def release(release_id: str, request: Request, who: Auth, ctx: Context):
    page = views.release_page(ctx, who, release_id)
    return render(request, "release.html", title=f"Release {release_id}", page=page)
