"""Sessions, turns, routing, the update stream and the provider registry.

Must not import: ``bridge`` (except ``bridge.rpc``). Adapters are reached through ``compat.base``.
"""
