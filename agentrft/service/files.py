"""`/v1/files`: upload, list, retrieve, download and delete.

A `fine-tune` upload is checked as an RFT dataset right away, with the same loader a run
uses (`agentrft.data.load_dataset`); a bad upload is refused with every bad line named by
its number. Files of other purposes are stored as they come (a job refuses them later).
The bytes live at `DATA/files/FILE_ID`.
"""

from __future__ import annotations

import re
import tempfile
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from agentrft.data import load_dataset
from agentrft.errors import ConfigError
from agentrft.serve.protocol import RequestError
from agentrft.service.state import caller, list_page, page_limit, state_of
from agentrft.service.store import new_id

router = APIRouter()
PURPOSES = {"fine-tune", "assistants", "batch", "vision", "user_data", "evals"}
MAX_UPLOAD_BYTES = 512 * 1024 * 1024


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": row["status"],
        "status_details": None,
        "expires_at": None,
    }


def parse_multipart(
    content_type: str, body: bytes
) -> tuple[dict[str, str], dict[str, tuple[str, bytes]]]:
    """Form fields and files of a multipart/form-data body (the standard library's MIME
    parser; no extra dependency)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise RequestError(
            "upload a file as multipart/form-data with fields `file` and `purpose`",
            "file",
            "invalid_content_type",
        )
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields: dict[str, str] = {}
    files: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            files[name] = (filename, data)
        else:
            fields[name] = data.decode("utf-8", errors="replace")
    return fields, files


def safe_filename(name: str) -> str:
    base = Path(name.replace("\\", "/")).name
    return re.sub(r"[^A-Za-z0-9._-]", "_", base)[:128] or "upload.jsonl"


def check_dataset(filename: str, data: bytes) -> int:
    """Rows in a valid RFT dataset; a RequestError naming each bad line otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / safe_filename(filename)
        path.write_bytes(data)
        try:
            rows = len(load_dataset(path))
        except ConfigError as exc:
            message = str(exc).replace(str(path), filename)
            raise RequestError(
                f"Invalid file format for fine-tuning: {message}", "file", "invalid_file_format"
            ) from None
        except UnicodeDecodeError:
            raise RequestError(
                f"{filename}: not UTF-8 text; a dataset is JSONL, one JSON object per line",
                "file",
                "invalid_file_format",
            ) from None
    return rows


@router.post("/v1/files")
async def create_file(request: Request) -> dict[str, Any]:
    owner = caller(request)
    state = state_of(request)
    declared = request.headers.get("content-length", "")
    if (
        declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES
    ):  # refused before it is read into memory
        raise RequestError(
            f"files are limited to {MAX_UPLOAD_BYTES // 2**20} MiB", "file", "file_too_large", 413
        )
    body = await request.body()
    if len(body) > MAX_UPLOAD_BYTES:
        raise RequestError(
            f"files are limited to {MAX_UPLOAD_BYTES // 2**20} MiB", "file", "file_too_large", 413
        )
    fields, files = parse_multipart(request.headers.get("content-type", ""), body)
    purpose = fields.get("purpose")
    if purpose is None:
        raise RequestError(
            "missing required parameter: 'purpose'", "purpose", "missing_required_parameter"
        )
    if purpose not in PURPOSES:
        raise RequestError(
            f"'{purpose}' is not one of {sorted(PURPOSES)} - 'purpose'", "purpose", "invalid_value"
        )
    if "file" not in files:
        raise RequestError(
            "missing required parameter: 'file'", "file", "missing_required_parameter"
        )
    filename, data = files["file"]
    rows = check_dataset(filename, data) if purpose == "fine-tune" else None
    file_id = new_id("file")
    state.files_dir.mkdir(parents=True, exist_ok=True)
    (state.files_dir / file_id).write_bytes(data)
    return file_object(
        state.store.add_file(file_id, owner, safe_filename(filename), purpose, len(data), rows)
    )


@router.get("/v1/files")
async def list_files(request: Request) -> dict[str, Any]:
    owner = caller(request)
    limit = page_limit(request, default=100)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError("order must be 'asc' or 'desc'", "order", "invalid_value")
    rows = state_of(request).store.files(
        owner,
        request.query_params.get("purpose"),
        request.query_params.get("after"),
        limit + 1,
        order,
    )
    return list_page([file_object(r) for r in rows], limit)


def owned_file(request: Request, file_id: str) -> dict[str, Any]:
    row = state_of(request).store.file(file_id, caller(request))
    if row is None:
        raise RequestError(f"No such File object: {file_id}", "id", "file_not_found", 404)
    return row


@router.get("/v1/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> dict[str, Any]:
    return file_object(owned_file(request, file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> FileResponse:
    row = owned_file(request, file_id)
    return FileResponse(
        state_of(request).files_dir / row["id"],
        media_type="application/octet-stream",
        filename=row["filename"],
    )


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
    owned_file(request, file_id)
    state = state_of(request)
    state.store.delete_file(file_id, caller(request))
    (state.files_dir / file_id).unlink(missing_ok=True)  # jobs keep their own copy
    return {"id": file_id, "object": "file", "deleted": True}
