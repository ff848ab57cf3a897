"""The JSON-RPC core with no I/O: parse, encode, message types and the error table.

No ``await``, no Starlette, no pydantic (only orjson and msgspec). Must not import the rest of
the project.
"""
