"""The OpenAI-compatible HTTP API (FastAPI on uvicorn): the app factory and its routes.

    GET  /health                 200 "ok" once warm (503 "loading" before): the plan and
                                 why, slots busy / waiting, finished requests, tokens
    GET  /metrics                the Prometheus text format (`metrics.py`)
    GET  /v1/models              the one served model
    POST /v1/chat/completions    serving_chat.OpenAIServingChat
    POST /v1/completions         serving_completion.OpenAIServingCompletion

Request bodies and errors are `protocol.py`'s; a route only hands its validated body to its
handler (`app.state`). Validation failures, unknown routes and refused requests all answer
with an OpenAI-style error body.
"""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from hispec_jax.serving import protocol
from hispec_jax.serving.protocol import APIError
from hispec_jax.serving.scheduler import Scheduler
from hispec_jax.serving.serving_chat import OpenAIServingChat
from hispec_jax.serving.serving_completion import OpenAIServingCompletion

router = APIRouter()


def error_response(status: int, message: str, param: str | None = None,
                   type_: str = "invalid_request_error", code: str | None = None):
    return JSONResponse(status_code=status,
                        content=protocol.error_body(message, param, type_, code))


@router.get("/health")
async def health(request: Request):
    state = request.app.state
    scheduler = state.scheduler
    if not scheduler.alive:
        return error_response(503, "the engine thread is not running", type_="server_error")
    body = {"model": state.model_name, **state.plan}
    if not scheduler.ready.is_set():
        return JSONResponse(status_code=503, content={
            "status": "loading", **body,
            "detail": "compiling every program serving needs before taking requests"})
    return {"status": "ok", **body, "warmup_seconds": scheduler.warmup_seconds,
            "warmup_compiles": scheduler.warmup_compiles, **scheduler.load()}


@router.get("/metrics")
async def metrics(request: Request):
    registry = request.app.state.scheduler.stats.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state
    return protocol.ModelList(data=[protocol.Model(id=state.model_name, created=state.created)])


@router.post("/v1/chat/completions")
async def chat_completions(body: protocol.ChatRequest, request: Request):
    return await request.app.state.chat.create(body, request.headers)


@router.post("/v1/completions")
async def completions(body: protocol.CompletionRequest, request: Request):
    return await request.app.state.completion.create(body, request.headers)


async def _api_error(request, e: APIError):
    return error_response(e.status, e.message, e.param, e.type, e.code)


async def _validation_error(request, e: RequestValidationError):
    """The first problem pydantic found, named by its parameter path ("messages.0.role")."""
    err = e.errors()[0]
    if err.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON "
                              f"({err.get('ctx', {}).get('error', err.get('msg'))})")
    param = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or None
    if err.get("type") == "extra_forbidden":
        message = f"unknown parameter: {param}"
    elif err.get("type") == "missing":
        message = f"missing required parameter: {param}"
    else:
        message = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
    return error_response(400, message, param)


async def _http_error(request, e: StarletteHTTPException):
    type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return error_response(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                          type_=type_)


def create_app(model, scheduler: Scheduler, model_name: str, plan: dict | str) -> FastAPI:
    """The ASGI app serving `model` through `scheduler` (started and stopped with the app);
    `model_name` is the id clients send, `plan` {"method", "plan", "reason"} what runs and
    why (or just the method's name)."""
    if isinstance(plan, str):
        plan = {"method": plan, "plan": plan, "reason": "given"}
    method = plan["method"]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not scheduler.alive:
            scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="hispec-jax", lifespan=lifespan)
    app.state.scheduler, app.state.model_name, app.state.plan = scheduler, model_name, plan
    app.state.created = int(time.time())
    app.state.chat = OpenAIServingChat(model, scheduler, model_name, method)
    app.state.completion = OpenAIServingCompletion(model, scheduler, model_name, method)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(router)
    return app
