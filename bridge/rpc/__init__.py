"""The JSON-RPC core with no I/O: parse, encode, message types and the error table.

Plain Python: no ``await``, no Starlette, no pydantic. Must not import the rest of the project.
"""
